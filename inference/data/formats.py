"""The registry of dataset formats: each format's reader and the names and record keys that
mark its datasets. Readers add themselves with `register_format` (a whole-file reader, such as
SQuAD's nested JSON) or `register_record_format` (a parser of one record, which reads the
records of any source: a jsonl or parquet file, a save_to_disk folder, a hub split)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.core.types import Example
from sieverag.inference.data.files import Record
from sieverag.inference.data.record_fields import RecordSource
from sieverag.inference.data.sources import DatasetSource

ExampleReader = Callable[[DatasetSource, bool], Iterator[Example]]
"""Reads a dataset (source, require_documents) into examples, lazily and in order."""

FileReader = Callable[[Path, bool], Iterator[Example]]
"""Reads one whole file (path, require_documents) into examples, lazily and in file order."""

RecordParser = Callable[[Record, RecordSource], Example]
"""Turns one record (a jsonl line, a table row) into an example."""


@dataclass(frozen=True)
class DatasetFormat:
    """A registered dataset format: its reader and how to recognise its datasets."""

    name: str
    read: ExampleReader
    name_hints: frozenset[str]
    """Words of a dataset's name (split on non-alphanumerics) that mark the format."""
    record_signatures: tuple[frozenset[str], ...]
    """Key sets of a first record that mark the format; the largest matching set wins."""


DATASET_FORMATS: dict[str, DatasetFormat] = {}
"""Every known format by name, filled by `register_format` / `register_record_format`."""


def _register(name: str, read: ExampleReader, name_hints: Iterable[str],
              record_signatures: Iterable[Iterable[str]]) -> None:
    if name in DATASET_FORMATS:
        raise ValueError(f"dataset format {name!r} is registered twice")
    DATASET_FORMATS[name] = DatasetFormat(
        name=name,
        read=read,
        name_hints=frozenset(name_hints),
        record_signatures=tuple(frozenset(keys) for keys in record_signatures),
    )


def register_format(
    name: str,
    *,
    name_hints: Iterable[str] = (),
    record_signatures: Iterable[Iterable[str]] = (),
) -> Callable[[FileReader], FileReader]:
    """Register a whole-file reader under `name` (a decorator); returns the reader unchanged.
    A dataset that is not one file (a table) is refused in this format."""

    def decorator(read_file: FileReader) -> FileReader:
        def read(source: DatasetSource, require_documents: bool) -> Iterator[Example]:
            if source.file is None:
                raise DatasetError(f"{source.label}: the {name!r} format is read from its own "
                                   "file, not from a table of records")
            return read_file(source.file, require_documents)

        _register(name, read, name_hints, record_signatures)
        return read_file

    return decorator


def register_record_format(
    name: str,
    *,
    documents_from: str | None,
    name_hints: Iterable[str] = (),
    record_signatures: Iterable[Iterable[str]] = (),
) -> Callable[[RecordParser], RecordParser]:
    """Register a format by its parser of one record (a decorator); returns the parser.

    `documents_from` names the field(s) documents come from, or None when the format has no
    documents; a format with documents rejects a record without any unless the caller passes
    `require_documents=False` (as a run that retrieves, or reads no documents, does).
    """

    def decorator(parse: RecordParser) -> RecordParser:
        def read(dataset: DatasetSource, require_documents: bool) -> Iterator[Example]:
            for location, number, record in dataset.records():
                source = RecordSource(dataset.label, location, f"{name}-{number}")
                example = parse(record, source)
                if documents_from and require_documents and not example.documents:
                    raise source.error(
                        f"record has no documents (expected in {documents_from}); retrieve "
                        "them from an index (retrieval.index), run only pipelines that read "
                        "none (direct), or load the questions alone (require_documents=False)"
                    )
                yield example

        _register(name, read, name_hints, record_signatures)
        return parse

    return decorator
