"""The registry of dataset formats: each format's reader and the file names and record keys
that mark its files. Readers add themselves with `register_format` (a whole-file reader) or
`register_jsonl_format` (a parser of one record per line)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sieverag.inference.data.files import Record, iter_jsonl
from sieverag.inference.data.records import RecordSource
from sieverag.inference.types import Example

ExampleReader = Callable[[Path, bool], Iterator[Example]]
"""Reads a file (path, require_documents) into examples, lazily and in file order."""

RecordParser = Callable[[Record, RecordSource], Example]
"""Turns one JSON record of a jsonl file into an example."""


@dataclass(frozen=True)
class DatasetFormat:
    """A registered dataset format: its reader and how to recognise its files."""

    name: str
    read: ExampleReader
    name_hints: frozenset[str]
    """Words of a file name (split on non-alphanumerics) that mark the format."""
    record_signatures: tuple[frozenset[str], ...]
    """Key sets of a first record that mark the format; the largest matching set wins."""


DATASET_FORMATS: dict[str, DatasetFormat] = {}
"""Every known format by name, filled by `register_format` / `register_jsonl_format`."""


def register_format(
    name: str,
    *,
    name_hints: Iterable[str] = (),
    record_signatures: Iterable[Iterable[str]] = (),
) -> Callable[[ExampleReader], ExampleReader]:
    """Register a whole-file reader under `name` (a decorator); returns the reader unchanged."""

    def decorator(read: ExampleReader) -> ExampleReader:
        if name in DATASET_FORMATS:
            raise ValueError(f"dataset format {name!r} is registered twice")
        DATASET_FORMATS[name] = DatasetFormat(
            name=name,
            read=read,
            name_hints=frozenset(name_hints),
            record_signatures=tuple(frozenset(keys) for keys in record_signatures),
        )
        return read

    return decorator


def register_jsonl_format(
    name: str,
    *,
    documents_from: str | None,
    name_hints: Iterable[str] = (),
    record_signatures: Iterable[Iterable[str]] = (),
) -> Callable[[RecordParser], RecordParser]:
    """Register a one-record-per-line format by its record parser (a decorator).

    `documents_from` names the field(s) documents come from, or None when the format has no
    documents; a format with documents rejects a record without any unless the caller passes
    `require_documents=False`.
    """

    def decorator(parse: RecordParser) -> RecordParser:
        def read(path: Path, require_documents: bool) -> Iterator[Example]:
            for line_number, record in iter_jsonl(path):
                source = RecordSource(path, f"line {line_number}", f"{name}-{line_number}")
                example = parse(record, source)
                if documents_from and require_documents and not example.documents:
                    raise source.error(
                        f"record has no documents (expected in {documents_from}); pass "
                        "require_documents=False to load the questions without documents"
                    )
                yield example

        register_format(name, name_hints=name_hints, record_signatures=record_signatures)(read)
        return parse

    return decorator
