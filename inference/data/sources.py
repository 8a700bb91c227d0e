"""Opening a dataset by the name `--dataset` takes: a file (jsonl, gzip-compressed or not;
parquet; SQuAD's JSON, zipped or not), a folder written by `datasets` save_to_disk
(`FOLDER[:SPLIT]`), or a hub split (`hf:NAME[:CONFIG]:SPLIT`). Each opens as a
`DatasetSource`: its records in order, the keys of its first record, and the words of its
name that hint at its format. `dataset_fingerprint` identifies a dataset's content."""

from __future__ import annotations

import hashlib
import re
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.data.files import (
    Record,
    check_readable,
    is_parquet,
    iter_jsonl,
    iter_parquet,
    load_json_document,
    parquet_columns,
)
from sieverag.inference.data.hf_datasets import (
    HUB_FORM,
    HUB_PREFIX,
    hub_fingerprint,
    load_disk_split,
    load_hub_split,
)

if TYPE_CHECKING:
    from datasets import Dataset

PlacedRecord = tuple[str, int, Record]
"""A record with its place: ("line 3" / "row 2", the number ids of rows without one use)."""


@dataclass(frozen=True)
class DatasetSource:
    """An opened dataset: where its records come from, and what names it."""

    label: str
    """How messages name the dataset: its path, `FOLDER:SPLIT` or `hf:...`."""
    name_words: frozenset[str]
    """Words of its name (split on non-alphanumerics), which may mark its format."""
    file: Path | None
    """The dataset's file, which whole-file formats (SQuAD's JSON) read; None for a table."""
    records: Callable[[], Iterator[PlacedRecord]]
    """Its records in order, each with its place."""
    first_keys: Callable[[], set[str]]
    """The keys of its first record (of a parquet file or table: its columns)."""


def open_dataset(dataset: str | Path) -> DatasetSource:
    """Open a dataset file, save_to_disk folder (`FOLDER[:SPLIT]`) or hub split (`hf:...`).

    A hub split or folder is loaded here (`datasets`, memory-mapped); a file is read lazily.
    Raises `DatasetError` for a path that is neither, an unknown split (listing the splits),
    and a hub dataset that cannot be loaded (offline: one not in the local cache).
    """
    text = str(dataset)
    if text.startswith(HUB_PREFIX):
        return _table_source(text, _name_words(text), load_hub_split(text))
    if (on_disk := _disk_folder(text)) is not None:
        folder, split = on_disk
        return _table_source(text, _name_words(f"{folder.name}:{split or ''}"),
                             load_disk_split(folder, split))
    path = Path(dataset)
    if not path.exists():
        raise DatasetError(f"{path}: no such dataset file or folder; check the path, or name a "
                           f"hub dataset as {HUB_FORM}")
    check_readable(path)
    words = _name_words(path.name)
    if is_parquet(path):
        return DatasetSource(
            label=text, name_words=words, file=path,
            records=lambda: ((f"row {n}", n, record) for n, record in iter_parquet(path)),
            first_keys=lambda: set(parquet_columns(path)))
    return DatasetSource(
        label=text, name_words=words, file=path,
        records=lambda: ((f"line {n}", n, record) for n, record in iter_jsonl(path)),
        first_keys=lambda: _first_record_keys(path))


def dataset_identity(dataset: str | Path) -> str:
    """The name that identifies a dataset wherever the command runs: a hub split as written
    (`hf:...`), a file or folder (`FOLDER[:SPLIT]`) by its absolute path."""
    text = str(dataset)
    return text if text.startswith(HUB_PREFIX) else str(Path(text).resolve())


def dataset_fingerprint(dataset: str | Path) -> str:
    """16 hex digits of sha256 identifying a dataset's content: a file's bytes, a folder's
    files (names and bytes), a hub split's name and cached revision."""
    text = str(dataset)
    if text.startswith(HUB_PREFIX):
        return hub_fingerprint(text, load_hub_split(text))
    on_disk = _disk_folder(text)
    digest = hashlib.sha256()
    if on_disk is None:
        for block in _blocks(Path(dataset)):
            digest.update(block)
    else:  # a folder's whole content, whichever split is read
        folder = on_disk[0]
        for member in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(str(member.relative_to(folder)).encode() + b"\0")
            for block in _blocks(member):
                digest.update(block)
    return digest.hexdigest()[:16]


def _blocks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        yield from iter(lambda: handle.read(1 << 20), b"")


def _disk_folder(text: str) -> tuple[Path, str | None] | None:
    """(folder, split) where `text` names a folder, or `FOLDER:SPLIT` of one; else None."""
    path = Path(text)
    if path.is_dir():
        return path, None
    folder, colon, split = text.rpartition(":")
    if colon and folder and not path.exists() and Path(folder).is_dir():
        return Path(folder), split
    return None


def _table_source(label: str, name_words: frozenset[str], table: Dataset) -> DatasetSource:
    """A `datasets` table as a source; its rows are numbered from 0, like `table[n]`."""
    return DatasetSource(
        label=label, name_words=name_words, file=None,
        records=lambda: ((f"row {n}", n, record) for n, record in enumerate(table)),
        first_keys=lambda: set(table.column_names))


def _name_words(name: str) -> frozenset[str]:
    return frozenset(re.split(r"[^a-z0-9]+", name.lower()))


def _first_record_keys(path: Path) -> set[str]:
    """The keys of a file's first record (for a zip, of the JSON document inside)."""
    if zipfile.is_zipfile(path):
        document = load_json_document(path)
        return set(document) if isinstance(document, dict) else set()
    try:
        for _, record in iter_jsonl(path):
            return set(record)
    except DatasetError as line_error:
        # Not jsonl; it may be one JSON document over many lines (a plain SQuAD file).
        try:
            document = load_json_document(path)
        except DatasetError:
            raise line_error from None
        if isinstance(document, dict):
            return set(document)
        raise
    raise DatasetError(f"{path}: holds no records (the file is empty)")
