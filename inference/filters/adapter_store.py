"""Trained filter adapters: what a filter folder holds, its card, and where one is found.

A filter adapter is a PEFT LoRA folder: `adapter_config.json`, `adapter_model.safetensors`
and sieverag's card `sieverag_adapter.json` (what it was trained on, how, and how well it
does). Every command that takes a filter finds it with `find_adapter`:

1. an explicit folder path;
2. a name in the user's cache, `$SIEVERAG_CACHE/adapters/<name>/` (a retrained filter
   installed there under a shipped name wins over the shipped one);
3. a filter shipped with sieverag, `inference/filters/shipped/<name>/` (package data).

Before an adapter is loaded onto a base model, `check_card` compares its card with that
model (sha256 of the weights) and with the filter prompt templates in use (sha256 of each
file): a filter is only meaningful on the weights and prompts it was trained with, and a
mismatch is refused with one error naming both sides.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sieverag.inference.core.errors import SieveragError
from sieverag.inference.core.io_utils import atomic_directory, parse_json, read_text
from sieverag.inference.llm.model_resolution import adapters_dir

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
CARD_FILE = "sieverag_adapter.json"
# What an installed or packaged adapter consists of: no checkpoints, no optimizer state.
ADAPTER_FILES = (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE)
SHIPPED_DIR = Path(__file__).parent / "shipped"
DEFAULT_FILTER_NAME = "smollm2-filter"
ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# Card keys that `check_card` compares with the model and prompts in use.
BASE_SHA_KEY = "base_model_sha256"
TEMPLATES_KEY = "prompt_templates"

Source = Literal["path", "cache", "shipped"]


class AdapterError(SieveragError):
    """An adapter folder is missing, malformed, or does not fit the model or prompts in use."""


@dataclass(frozen=True)
class FoundAdapter:
    """An adapter folder and where the resolver found it."""

    name: str
    path: Path
    source: Source


# ----- where adapters are ------------------------------------------------------------------


def _adapters_in(folder: Path) -> dict[str, Path]:
    if not folder.is_dir():
        return {}
    # Hidden folders are an interrupted install's staging, never an adapter.
    return {child.name: child for child in sorted(folder.iterdir())
            if not child.name.startswith(".") and (child / CONFIG_FILE).is_file()}


def cached_adapters() -> dict[str, Path]:
    """Name → folder of every adapter in the user's cache ($SIEVERAG_CACHE/adapters/)."""
    return _adapters_in(adapters_dir())


def shipped_adapters() -> dict[str, Path]:
    """Name → folder of every adapter shipped with sieverag."""
    return _adapters_in(SHIPPED_DIR)


def available_adapters() -> list[tuple[FoundAdapter, bool]]:
    """Every adapter found by name, cache first, each with whether a name lookup picks it
    (a shipped adapter whose name is also in the cache is shadowed)."""
    cached = cached_adapters()
    found = [(FoundAdapter(name, path, "cache"), True) for name, path in cached.items()]
    found += [(FoundAdapter(name, path, "shipped"), name not in cached)
              for name, path in shipped_adapters().items()]
    return found


def _looks_like_path(text: str) -> bool:
    return "/" in text or "\\" in text or text.startswith(("~", "."))


def find_adapter(name_or_path: str) -> FoundAdapter:
    """The adapter for a folder path, else for a name in the cache, else a shipped name."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / CONFIG_FILE).is_file():
            raise AdapterError(f"adapter folder {path} has no {CONFIG_FILE}: give a PEFT LoRA "
                               "adapter folder (a training output or an installed filter)")
        return FoundAdapter(path.name, path, "path")
    if _looks_like_path(name_or_path):
        raise AdapterError(f"adapter folder {path} does not exist")
    for source, found in (("cache", cached_adapters()), ("shipped", shipped_adapters())):
        if name_or_path in found:
            return FoundAdapter(name_or_path, found[name_or_path], source)
    known = ", ".join(sorted({a.name for a, _ in available_adapters()})) or "none"
    raise AdapterError(f"adapter {name_or_path!r} is neither a folder nor the name of an "
                       f"installed or shipped filter (known: {known}; see `sieverag filter list`)")


# ----- what an adapter folder holds ------------------------------------------------------


def read_adapter_config(folder: str | Path) -> dict[str, Any]:
    """The adapter's `adapter_config.json`, checked to be a PEFT LoRA config."""
    config_file = Path(folder) / CONFIG_FILE
    if not config_file.is_file():
        what = "does not exist" if not Path(folder).exists() else f"has no {CONFIG_FILE}"
        raise AdapterError(f"adapter folder {folder} {what}: give a PEFT LoRA adapter folder "
                           f"(holding {CONFIG_FILE} and {WEIGHTS_FILE})")
    config = _read_json(config_file)
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{config_file} is not a LoRA adapter config (peft_type "
                           f"{config.get('peft_type')!r}); only LoRA adapters are supported")
    return config


def read_card(folder: str | Path) -> dict[str, Any] | None:
    """The adapter's card (`sieverag_adapter.json`), or None when it has none."""
    path = Path(folder) / CARD_FILE
    return _read_json(path) if path.is_file() else None


def _read_json(path: Path) -> dict[str, Any]:
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


def check_adapter_files(folder: str | Path) -> None:
    """Raise `AdapterError` naming the file unless `folder` holds a LoRA config, a
    safetensors weights file with tensors, and (if present) a card that parses."""
    folder = Path(folder)
    read_adapter_config(folder)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise AdapterError(f"adapter folder {folder} has no {WEIGHTS_FILE}")
    if not safetensors_header(weights)[0]:
        raise AdapterError(f"{weights} holds no tensors")
    read_card(folder)


# ----- identity: weights, prompts, content -------------------------------------------------


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


def filter_template_hashes(filter_format: str | None = None) -> dict[str, str]:
    """sha256 of each filter prompt template file in use, by template name: those of one
    filter format (`filter_format.FORMAT_TEMPLATES`), or of every format (None)."""
    from sieverag.inference.core.prompt_templates import load_template
    from sieverag.inference.filters.filter_format import FORMAT_TEMPLATES

    names = ([n for names in FORMAT_TEMPLATES.values() for n in names] if filter_format is None
             else FORMAT_TEMPLATES[filter_format])
    return {name: load_template(name).sha256 for name in names}


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


def check_card(folder: str | Path, base_model_dir: str | Path) -> None:
    """Refuse an adapter whose card names other base weights or other filter prompts than
    the ones in use, with one error naming both. An adapter without a card is not checked."""
    card = read_card(folder)
    if card is None:
        return
    trained_on = card.get(BASE_SHA_KEY)
    if trained_on:
        in_use = weights_sha256(base_model_dir)
        if in_use != trained_on:
            raise AdapterError(
                f"filter adapter {folder} was trained on base model "
                f"{card.get('base_model', '?')} (weights sha256 {trained_on[:16]}…), but the "
                f"model in use, {base_model_dir}, has weights sha256 {in_use[:16]}…: run it "
                f"on {card.get('base_model', '<its base model>')} (--models.filter.model), or "
                "use a filter trained on this model")
    check_chat_template(folder, card, base_model_dir)
    check_prompts(folder, card)


def check_chat_template(folder: str | Path, card: dict[str, Any],
                        base_model_dir: str | Path) -> None:
    """Refuse an adapter whose card names another chat template than the one the model in
    use renders prompts with (its tokenizer's own, else sieverag's fallback)."""
    from sieverag.inference.llm.chat_template import CARD_KEY, model_template_identity

    trained_with = card.get(CARD_KEY)
    if not trained_with:
        return
    in_use = model_template_identity(str(Path(base_model_dir).resolve()))
    if in_use != trained_with:
        raise AdapterError(
            f"filter adapter {folder} was trained with the chat template "
            f"{trained_with.get('name')} (sha256 {str(trained_with.get('sha256'))[:16]}…), but "
            f"the model in use, {base_model_dir}, renders prompts with {in_use['name']} (sha256 "
            f"{in_use['sha256'][:16]}…): the filter reads its verdicts after the template it "
            "learned; use that model's tokenizer or retrain the filter")


def check_prompts(folder: str | Path, card: dict[str, Any]) -> None:
    """Refuse an adapter whose card names other filter prompt templates than the ones in use."""
    in_use = filter_template_hashes()
    for name, trained_sha in (card.get(TEMPLATES_KEY) or {}).items():
        current = in_use.get(name)
        if current != trained_sha:
            raise AdapterError(
                f"filter adapter {folder} was trained with the prompt template {name} "
                f"(sha256 {str(trained_sha)[:16]}…), but the template in use has sha256 "
                f"{str(current)[:16]}…: the filter only works with the prompts it learned; "
                "restore that template or retrain the filter")


# ----- installing into the cache -----------------------------------------------------------


def install_adapter(source: str | Path, name: str | None = None) -> Path:
    """Copy an adapter's files (config, weights, card) into the cache as `name` (default:
    the folder's name) after checking them (files, and the card's prompt templates; its base
    model is checked when a command loads it); a failed install leaves the cache as it was."""
    source = Path(source).expanduser()
    check_adapter_files(source)
    check_prompts(source, read_card(source) or {})
    name = name or source.name
    if not ADAPTER_NAME.fullmatch(name):
        raise AdapterError(f"adapter name {name!r}: use letters, digits, '.', '_' or '-', "
                           "starting with a letter or digit")
    target = adapters_dir() / name
    if target.resolve() == source.resolve():
        raise AdapterError(f"{source} is already installed as {name!r}")
    with atomic_directory(target) as staging:
        for file in ADAPTER_FILES:
            if (source / file).is_file():
                shutil.copy2(source / file, staging / file)
    return target


def resolve_filter(name_or_path: str, base_model: str) -> Path:
    """The folder of the filter adapter `name_or_path` (see `find_adapter`), checked to be a
    whole adapter whose card fits `base_model` (an embedded name or a local folder) and the
    filter prompts in use. Every command that loads a filter onto a model calls this."""
    from sieverag.inference.llm.model_resolution import resolve_model

    found = find_adapter(name_or_path)
    check_adapter_files(found.path)
    check_card(found.path, resolve_model(base_model))
    return found.path
