"""User-facing errors of the serving package (the CLI prints them as one line)."""

from inference.errors import SieveragError


class AdapterError(SieveragError):
    """An --adapter argument names no usable PEFT LoRA adapter, or clashes with another name."""


class ServerStartError(SieveragError):
    """A server could not start: port in use, missing executable, not ready in time, exited."""
