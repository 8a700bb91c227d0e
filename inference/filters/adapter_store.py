"""Where trained filter adapters are: found by path or name, installed into the user's cache,
and resolved, checked, for a base model.

A filter adapter is a PEFT LoRA folder: `adapter_config.json`, `adapter_model.safetensors`
(`adapter_files`) and sieverag's card `sieverag_adapter.json` (`card.card_file`: what it was
trained on, how, and how well it does). Every command that takes a filter finds it with
`find_adapter`:

1. an explicit folder path;
2. a name in the user's cache, `$SIEVERAG_CACHE/adapters/<name>/` (a retrained filter
   installed there under a shipped name wins over the shipped one);
3. a filter shipped with sieverag, `inference/filters/shipped/<name>/` (package data).

Before an adapter is loaded onto a base model, `resolve_filter` checks its card against that
model and the filter prompt templates in use (`card_file.check_card`).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sieverag.inference.core.io_utils import atomic_directory
from sieverag.inference.filters.adapter_files import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    AdapterError,
    read_adapter_config,
    safetensors_header,
)
from sieverag.inference.filters.card.card_file import (
    CARD_FILE,
    check_card,
    check_prompts,
    read_card,
)
from sieverag.inference.llm.model_resolution import adapters_dir

SHIPPED_DIR = Path(__file__).parent / "shipped"
DEFAULT_FILTER_NAME = "smollm2-filter"
ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# What an installed or packaged adapter consists of: no checkpoints, no optimizer state.
ADAPTER_FILES = (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE)

Source = Literal["path", "cache", "shipped"]


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


# ----- checking and installing -------------------------------------------------------------


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
