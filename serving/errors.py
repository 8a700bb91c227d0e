"""User-facing errors of the serving package (the CLI prints them as one line)."""

from sieverag.inference.core.errors import SieveragError
from sieverag.inference.filters.adapter_files import AdapterError

__all__ = ["AdapterError", "ServerStartError"]


class ServerStartError(SieveragError):
    """A server could not start: port in use, missing executable, not ready in time, exited."""
