"""LoRA adapter arguments shared by both engines: `NAME=PATH` parsing, default names, ranks.

A served adapter is chosen by its name in the request's `model` field, as with vLLM's
`--lora-modules`. A bare PATH gets the name `<folder>-<hash8>`, the hash taken over the
adapter's config and weights: vLLM keys its prefix cache by adapter name, so a retrained
adapter served under a reused name would be answered from the old adapter's cache.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from serving.errors import AdapterError

ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter the server offers: its served name, folder and largest LoRA rank."""

    name: str
    path: Path
    rank: int


def parse_adapter(spec: str) -> Adapter:
    """Read one `NAME=PATH` or bare `PATH` argument into a checked `Adapter`."""
    name, sep, rest = spec.partition("=")
    whole = Path(spec).expanduser()
    # A folder whose own name holds '=' (e.g. runs/lr=1e-4) is a bare path, not NAME=PATH.
    explicit = (bool(sep) and ADAPTER_NAME.fullmatch(name) is not None
                and not (whole.is_dir() and not Path(rest).expanduser().is_dir()))
    if sep and not explicit and not whole.is_dir():
        raise AdapterError(f"--adapter {spec!r}: give NAME=PATH, NAME made of letters, digits, "
                           "'.', '_' or '-' (starting with a letter or digit), or a bare PATH")
    path = Path(rest if explicit else spec).expanduser().resolve()
    rank = lora_rank(path)
    return Adapter(name if explicit else default_adapter_name(path), path, rank)


def resolve_adapters(specs: Sequence[str], base_name: str) -> tuple[Adapter, ...]:
    """Parse every --adapter argument; names must be unique and differ from the base model."""
    adapters = tuple(parse_adapter(spec) for spec in specs)
    seen: dict[str, Path] = {}
    for adapter in adapters:
        if adapter.name == base_name:
            raise AdapterError(f"adapter name {adapter.name!r} is the base model's name; "
                               "give the adapter another NAME (NAME=PATH)")
        if adapter.name in seen:
            raise AdapterError(f"adapter name {adapter.name!r} is given twice ({seen[adapter.name]}"
                               f" and {adapter.path}); give each adapter its own NAME")
        seen[adapter.name] = adapter.path
    return adapters


def read_adapter_config(path: Path) -> dict:
    """The adapter's `adapter_config.json`, checked to be a PEFT LoRA config."""
    config_file = path / "adapter_config.json"
    if not config_file.is_file():
        what = "does not exist" if not path.exists() else "has no adapter_config.json"
        raise AdapterError(f"adapter folder {path} {what}: give a PEFT LoRA adapter folder "
                           "(holding adapter_config.json and adapter_model.safetensors)")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"cannot read {config_file}: {exc}") from exc
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{config_file} is not a LoRA adapter config (peft_type "
                           f"{config.get('peft_type') if isinstance(config, dict) else None!r}); "
                           "only LoRA adapters can be served")
    return config


def lora_rank(path: Path) -> int:
    """The largest LoRA rank of the adapter: `r`, or a larger per-module `rank_pattern` value."""
    config = read_adapter_config(path)
    ranks = [config.get("r"), *(config.get("rank_pattern") or {}).values()]
    if any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ranks):
        raise AdapterError(f"{path / 'adapter_config.json'} has no valid LoRA rank "
                           f"(r={config.get('r')!r}); is it a complete PEFT LoRA adapter?")
    return max(ranks)


def default_adapter_name(path: Path) -> str:
    """`<folder name>-<first 8 hex digits of the adapter's content hash>`."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.name).strip("-._") or "adapter"
    return f"{stem}-{adapter_content_hash(path)[:8]}"


def adapter_content_hash(path: Path) -> str:
    """SHA-256 over the adapter's config and weight files (what the server would load)."""
    files = [path / "adapter_config.json", *(path / name for name in _WEIGHT_FILES)]
    digest = hashlib.sha256()
    for file in files:
        if file.is_file():
            digest.update(file.name.encode() + b"\0")
            with file.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()
