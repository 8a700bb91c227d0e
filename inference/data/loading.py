"""Loading a dataset file as `Example`s: `load_examples` takes a format by name, or detects it
(`detect_format`) from the file name and, failing that, from the keys of the first record.
Readers stream, so `limit` stops reading early."""

from __future__ import annotations

import re
import zipfile
from itertools import islice
from pathlib import Path

import sieverag.inference.data.readers  # noqa: F401  (registers the built-in formats)
from sieverag.inference.data.files import check_readable, iter_jsonl, load_json_document
from sieverag.inference.data.formats import DATASET_FORMATS
from sieverag.inference.errors import DatasetError
from sieverag.inference.types import Example


def load_examples(
    path: str | Path,
    fmt: str = "auto",
    limit: int | None = None,
    *,
    require_documents: bool = True,
) -> list[Example]:
    """Read the examples of a dataset file, in file order.

    `fmt` is a name from `DATASET_FORMATS` or "auto" (see `detect_format`); `limit` keeps the
    first N examples and stops reading there. Raises `DatasetError` for a missing or
    unreadable file, a malformed line, a record without a question or answers, an unknown
    format, a file with no examples, and (unless `require_documents=False`) a record without
    documents in a format that has them.
    """
    path = Path(path)
    if fmt != "auto" and fmt not in DATASET_FORMATS:
        raise DatasetError(
            f"unknown dataset format {fmt!r} for {path}; known formats: "
            f"{', '.join(sorted(DATASET_FORMATS))} (or 'auto')"
        )
    if limit is not None and limit < 0:
        raise DatasetError(f"limit must be 0 or more, got {limit} (for {path})")
    check_readable(path)
    name = detect_format(path) if fmt == "auto" else fmt
    examples = list(islice(DATASET_FORMATS[name].read(path, require_documents), limit))
    if not examples and limit != 0:
        raise DatasetError(f"{path}: holds no examples (read as format {name!r})")
    return examples


def example_source(example: Example) -> str:
    """The name of the dataset an example came from (its format's name, or the `source` a
    common-format row gives): what labels, training splits and reports call its source."""
    return str(example.metadata.get("dataset", "unknown"))


def detect_format(path: str | Path) -> str:
    """Name the format of a dataset file.

    The file name decides when exactly one format claims one of its words (`hotpotqa`, `nq`,
    `popqa`, `squad`, `triviaqa`, `arc`), unless the first record's keys fit another format
    and none of the named one's. Otherwise the keys of the first record decide: the format
    with the largest key signature contained in them. Raises `DatasetError` when nothing
    (or more than one format equally) fits.
    """
    path = Path(path)
    check_readable(path)
    words = set(re.split(r"[^a-z0-9]+", path.name.lower()))
    named = [f.name for f in DATASET_FORMATS.values() if f.name_hints & words]
    keys = _first_record_keys(path)
    by_keys = _formats_matching_keys(keys)
    if len(named) == 1 and (named[0] in by_keys or not by_keys):
        return named[0]
    if by_keys:
        best = max(by_keys.values())
        winners = sorted(name for name, size in by_keys.items() if size == best)
        if len(winners) == 1:
            return winners[0]
        raise DatasetError(
            f"{path}: the first record fits several formats ({', '.join(winners)}); "
            "pass the format name explicitly"
        )
    raise DatasetError(
        f"{path}: cannot tell the dataset format from the file name or from the first "
        f"record's keys ({', '.join(sorted(keys)) or 'none'}); pass one of "
        f"{', '.join(sorted(DATASET_FORMATS))} explicitly"
    )


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


def _formats_matching_keys(keys: set[str]) -> dict[str, int]:
    """Each format with a signature inside `keys`, with the size of its largest such one."""
    sizes = {
        spec.name: max((len(sig) for sig in spec.record_signatures if sig <= keys), default=0)
        for spec in DATASET_FORMATS.values()
    }
    return {name: size for name, size in sizes.items() if size}
