"""Datasets of the Hugging Face `datasets` library: a hub split named `hf:NAME[:CONFIG]:SPLIT`
(read from the local hub cache when offline, downloaded once when online) and a folder written
by `save_to_disk` (a `DatasetDict` folder needs a split: `FOLDER:SPLIT`). Every problem ends
in one `DatasetError` that names the dataset; `datasets` is imported only when one is used."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sieverag.inference.core.errors import DatasetError

if TYPE_CHECKING:
    from datasets import Dataset

HUB_PREFIX = "hf:"
HUB_FORM = "hf:NAME[:CONFIG]:SPLIT"


@dataclass(frozen=True)
class HubSplit:
    """One split of a hub dataset, as `hf:NAME[:CONFIG]:SPLIT` names it."""

    name: str
    config: str | None
    split: str

    @classmethod
    def parse(cls, spec: str) -> HubSplit:
        """Read `hf:NAME:SPLIT` or `hf:NAME:CONFIG:SPLIT`; anything else is an error."""
        parts = spec.removeprefix(HUB_PREFIX).split(":")
        if len(parts) not in (2, 3) or not all(part.strip() for part in parts):
            raise DatasetError(f"{spec}: a hub dataset is named {HUB_FORM} (e.g. "
                               "hf:hotpot_qa:distractor:validation, hf:nq_open:validation)")
        name, *config, split = (part.strip() for part in parts)
        return cls(name=name, config=config[0] if config else None, split=split)


def load_hub_split(spec: str) -> Dataset:
    """The split `spec` names, by `datasets.load_dataset(NAME, CONFIG, split=SPLIT)`."""
    import datasets
    from datasets.exceptions import DatasetsError

    hub = HubSplit.parse(spec)
    try:
        return datasets.load_dataset(hub.name, hub.config, split=hub.split)
    except (OSError, ValueError, RuntimeError, DatasetsError) as err:
        raise DatasetError(_hub_problem(spec, hub, err)) from None


def _hub_problem(spec: str, hub: HubSplit, err: Exception) -> str:
    """The one-line message for a hub dataset `datasets` could not load."""
    import datasets

    reason = _one_line(err)
    # datasets words an unknown split 'Unknown split "x". Should be one of [...]'.
    if isinstance(err, ValueError) and "split" in reason.lower():
        return f"{spec}: has no split {hub.split!r} ({reason})"
    if datasets.config.HF_HUB_OFFLINE:
        return (f"{spec}: {hub.name} is not in the local Hugging Face cache (or not with this "
                "config), and HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set, so it cannot be "
                f"downloaded; unset it to download the dataset once ({reason})")
    return f"{spec}: cannot be loaded from the Hugging Face hub ({reason})"


def load_disk_split(folder: Path, split: str | None) -> Dataset:
    """The dataset a `save_to_disk` folder holds; for a `DatasetDict`, its split `split`."""
    import datasets
    from datasets.exceptions import DatasetsError

    try:
        loaded = datasets.load_from_disk(str(folder))
    except (OSError, ValueError, DatasetsError) as err:
        raise DatasetError(
            f"{folder}: is not a file, nor a folder written by `datasets` save_to_disk "
            f"({_one_line(err)}); pass a dataset file, such a folder, or {HUB_FORM}"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        splits = ", ".join(loaded)
        if split is None:
            raise DatasetError(f"{folder}: holds the splits {splits}; name one as "
                               f"{folder}:SPLIT")
        if split not in loaded:
            raise DatasetError(f"{folder}:{split}: there is no split {split!r}; the folder "
                               f"holds {splits}")
        return loaded[split]
    if split is not None:
        raise DatasetError(f"{folder}:{split}: {folder} holds one dataset, not splits; "
                           f"drop ':{split}'")
    return loaded


def hub_fingerprint(spec: str, table: Dataset) -> str:
    """What identifies a hub split: its name and its cache files (named by the revision's
    folder), hashed; 16 hex digits."""
    digest = hashlib.sha256(spec.encode())
    for cache_file in table.cache_files:
        revision_and_name = Path(cache_file.get("filename", "")).parts[-2:]
        digest.update(b"\0" + "/".join(revision_and_name).encode())
    return digest.hexdigest()[:16]


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split()) or type(err).__name__
