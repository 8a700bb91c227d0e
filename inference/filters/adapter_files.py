"""What a filter adapter folder holds and what identifies it: the PEFT LoRA config
(`adapter_config.json`) and weights (`adapter_model.safetensors`), read and checked, and the
digests that name them (the base model's weights, the adapter's content). The card beside
them is `card/card_file.py`'s; where adapters are found and installed, `adapter_store.py`'s.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import struct
from pathlib import Path
from typing import Any

from sieverag.inference.core.errors import SieveragError
from sieverag.inference.core.io_utils import parse_json, read_text

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


class AdapterError(SieveragError):
    """An adapter folder is missing, malformed, or does not fit the model or prompts in use."""


def read_adapter_config(folder: str | Path) -> dict[str, Any]:
    """The adapter's `adapter_config.json`, checked to be a PEFT LoRA config."""
    config_file = Path(folder) / CONFIG_FILE
    if not config_file.is_file():
        what = "does not exist" if not Path(folder).exists() else f"has no {CONFIG_FILE}"
        raise AdapterError(f"adapter folder {folder} {what}: give a PEFT LoRA adapter folder "
                           f"(holding {CONFIG_FILE} and {WEIGHTS_FILE})")
    config = read_json_object(config_file)
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{config_file} is not a LoRA adapter config (peft_type "
                           f"{config.get('peft_type')!r}); only LoRA adapters are supported")
    return config


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in an adapter folder's file `path` (`AdapterError` naming it
    otherwise)."""
    data = parse_json(read_text(path, AdapterError), str(path), "fix the file, or package or "
                      "install the adapter again", error=AdapterError)
    if not isinstance(data, dict):
        raise AdapterError(f"{path} must hold a JSON object")
    return data


def safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors file (tensor names, dtypes, shapes, byte offsets)
    and the file offset where the tensor data starts."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > path.stat().st_size:
                raise ValueError(f"header length {length} exceeds the file")
            header = json.loads(handle.read(length))
    except (OSError, struct.error, ValueError, RecursionError) as err:
        raise AdapterError(f"{path} is not a readable safetensors file: {err}") from err
    if not isinstance(header, dict):
        raise AdapterError(f"{path} is not a readable safetensors file: bad header")
    header.pop("__metadata__", None)
    return header, 8 + length


def weights_sha256(model_dir: str | Path) -> str:
    """SHA-256 over a model folder's safetensors tensors: names, dtypes, shapes and bytes, in
    name order (independent of how the header is laid out or which shard holds a tensor)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise AdapterError(f"model folder {model_dir} holds no .safetensors weights to identify")
    stamp = tuple((str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _weights_sha256(stamp)


@functools.cache
def _weights_sha256(stamp: tuple[tuple[str, int, int], ...]) -> str:
    entries = []
    for name, _, _ in stamp:
        header, data_start = safetensors_header(Path(name))
        entries += [(tensor, info, name, data_start) for tensor, info in header.items()]
    digest = hashlib.sha256()
    with contextlib.ExitStack() as stack:
        handles = {name: stack.enter_context(open(name, "rb")) for name, _, _ in stamp}
        for tensor, info, name, data_start in sorted(entries, key=lambda e: e[0]):
            digest.update(f"{tensor}\0{info['dtype']}\0{info['shape']}\0".encode())
            begin, end = info["data_offsets"]
            handles[name].seek(data_start + begin)
            remaining = end - begin
            while remaining:
                block = handles[name].read(min(remaining, 1 << 22))
                if not block:
                    raise AdapterError(f"{name} is truncated (tensor {tensor})")
                digest.update(block)
                remaining -= len(block)
    return digest.hexdigest()


def adapter_content_hash(folder: str | Path) -> str:
    """SHA-256 over the adapter's config and weights (what a server loads)."""
    digest = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        path = Path(folder) / name
        digest.update(name.encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def content_name(stem: str, folder: str | Path) -> str:
    """`<stem>-<first 8 hex digits of the adapter's content hash>`, `stem` cut to the name
    characters: unique per weights, which vLLM needs (its prefix cache is keyed by adapter
    name). Training names a new filter so; a server names a bare adapter folder so."""
    clean = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._") or "adapter"
    return f"{clean}-{adapter_content_hash(folder)[:8]}"
