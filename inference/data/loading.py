"""Loading a dataset as `Example`s: `load_examples` opens it (a file, a save_to_disk folder or
a hub split, see `sources`) and reads it in a format named, or detected (`detect_format`) from
its name and, failing that, from the keys of its first record. Readers stream, so `limit`
stops reading early."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import sieverag.inference.data.readers  # noqa: F401  (registers the built-in formats)
import sieverag.inference.data.standard_schemas  # noqa: F401  (registers the published schemas)
from sieverag.inference.core.errors import DatasetError
from sieverag.inference.core.types import Example
from sieverag.inference.data.formats import DATASET_FORMATS
from sieverag.inference.data.sources import DatasetSource, open_dataset


def load_examples(
    dataset: str | Path,
    fmt: str = "auto",
    limit: int | None = None,
    *,
    require_documents: bool = True,
) -> list[Example]:
    """Read the examples of a dataset, in its order.

    `dataset` is a file (jsonl, gzip or not; parquet; SQuAD's JSON or zip), a `datasets`
    save_to_disk folder (`FOLDER[:SPLIT]`) or a hub split (`hf:NAME[:CONFIG]:SPLIT`). `fmt`
    is a name from `DATASET_FORMATS` or "auto" (see `detect_format`); `limit` keeps the first
    N examples and stops reading there. Raises `DatasetError` for a missing or unreadable
    dataset, an unknown split (listing the splits), a hub dataset that cannot be loaded, a
    malformed record, a record without a question or answers, an unknown format, a dataset
    with no examples, and (unless `require_documents=False`) a record without documents in a
    format that has them.
    """
    if fmt != "auto" and fmt not in DATASET_FORMATS:
        raise DatasetError(
            f"unknown dataset format {fmt!r} for {dataset}; known formats: "
            f"{', '.join(sorted(DATASET_FORMATS))} (or 'auto')"
        )
    if limit is not None and limit < 0:
        raise DatasetError(f"limit must be 0 or more, got {limit} (for {dataset})")
    source = open_dataset(dataset)
    name = _detect(source) if fmt == "auto" else fmt
    examples = list(islice(DATASET_FORMATS[name].read(source, require_documents), limit))
    if not examples and limit != 0:
        raise DatasetError(f"{source.label}: holds no examples (read as format {name!r})")
    return examples


def example_source(example: Example) -> str:
    """The name of the dataset an example came from (its format's name, or the `source` a
    common-format row gives): what labels, training splits and reports call its source."""
    return str(example.metadata.get("dataset", "unknown"))


def detect_format(dataset: str | Path) -> str:
    """Name the format of a dataset (any `load_examples` takes).

    The dataset's name (a file's name, a hub dataset's name and config) decides when exactly
    one format claims one of its words (`hotpotqa`, `nq`, `popqa`, `squad`, `triviaqa`, `arc`,
    `asqa`, `2wiki`, ...), unless the first record's keys fit another format and none of the
    named one's. Otherwise the keys of the first record decide: the format with the largest
    key signature contained in them. Raises `DatasetError` when nothing (or more than one
    format equally) fits, listing the keys found and the formats known with their keys.
    """
    return _detect(open_dataset(dataset))


def _detect(source: DatasetSource) -> str:
    named = [f.name for f in DATASET_FORMATS.values() if f.name_hints & source.name_words]
    keys = source.first_keys()
    by_keys = _formats_matching_keys(keys)
    if len(named) == 1 and (named[0] in by_keys or not by_keys):
        return named[0]
    if by_keys:
        best = max(by_keys.values())
        winners = sorted(name for name, size in by_keys.items() if size == best)
        if len(winners) == 1:
            return winners[0]
        raise DatasetError(
            f"{source.label}: the first record fits several formats ({', '.join(winners)}); "
            "pass the format name explicitly"
        )
    raise DatasetError(
        f"{source.label}: cannot tell the dataset format from its name or from the first "
        f"record's keys ({', '.join(sorted(keys)) or 'none'}); the formats known, by the keys "
        f"that mark them: {_known_signatures()}; pass one of them explicitly"
    )


def _known_signatures() -> str:
    """Each format with its key signatures, e.g. `arc {answerKey, choices, question}`."""
    return "; ".join(
        f"{spec.name} " + " or ".join(
            "{" + ", ".join(sorted(signature)) + "}" for signature in spec.record_signatures)
        for spec in sorted(DATASET_FORMATS.values(), key=lambda spec: spec.name)
    )


def _formats_matching_keys(keys: set[str]) -> dict[str, int]:
    """Each format with a signature inside `keys`, with the size of its largest such one."""
    sizes = {
        spec.name: max((len(sig) for sig in spec.record_signatures if sig <= keys), default=0)
        for spec in DATASET_FORMATS.values()
    }
    return {name: size for name, size in sizes.items() if size}
