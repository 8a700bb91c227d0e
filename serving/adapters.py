"""LoRA adapter arguments shared by both engines: `NAME=PATH` parsing, default names, ranks.

PATH is an adapter folder or the name of an installed or shipped filter (found by
`inference.filters.adapter_store.find_adapter`, like every other command); an adapter whose card
does not fit the served base model or the filter prompts is refused before anything loads.

A served adapter is chosen by its name in the request's `model` field, as with vLLM's
`--lora-modules`. A bare PATH gets the name `<folder>-<hash8>`, the hash taken over the
adapter's config and weights: vLLM keys its prefix cache by adapter name, so a retrained
adapter served under a reused name would be answered from the old adapter's cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sieverag.inference.filters.adapter_files import AdapterError, content_name, read_adapter_config
from sieverag.inference.filters.adapter_store import ADAPTER_NAME, find_adapter
from sieverag.inference.filters.card.card_file import check_card


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
        raise AdapterError(f"--adapters {spec!r}: give NAME=PATH, NAME made of letters, digits, "
                           "'.', '_' or '-' (starting with a letter or digit), or a bare PATH")
    path = find_adapter(rest if explicit else spec).path.resolve()
    rank = lora_rank(path)
    return Adapter(name if explicit else default_adapter_name(path), path, rank)


def resolve_adapters(specs: Sequence[str], base_name: str,
                     base_model_dir: Path | None = None) -> tuple[Adapter, ...]:
    """Parse every --adapter argument; names must be unique and differ from the base model.
    With the base model's folder, each adapter's card must fit it (`check_card`)."""
    adapters = tuple(parse_adapter(spec) for spec in specs)
    if base_model_dir is not None:
        for adapter in adapters:
            check_card(adapter.path, base_model_dir)
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


def lora_rank(path: Path) -> int:
    """The largest LoRA rank of the adapter: `r`, or a larger per-module `rank_pattern` value."""
    config = read_adapter_config(path)
    ranks = [config.get("r"), *(config.get("rank_pattern") or {}).values()]
    if any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ranks):
        raise AdapterError(f"{path / 'adapter_config.json'} has no valid LoRA rank "
                           f"(r={config.get('r')!r}); is it a complete PEFT LoRA adapter?")
    return max(ranks)


def default_adapter_name(path: Path) -> str:
    """`<folder name>-<hash8>` (`content_name`): unique per weights."""
    return content_name(path.name, path)
