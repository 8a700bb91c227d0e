"""The settings fields of every command that reads a QA dataset (`eval`, `demo`, `label`,
`hard-negatives`, `eval-filter`, `fit-combination`), declared once so that each flag means and
says the same everywhere: `dataset = dataset_field()`, `dataset_format = dataset_format_field()`,
`limit = limit_field()` in a `@settings` class (its `__post_init__` checks the limit with
`at_least(1, limit=self.limit)`)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

# The package's __init__ has registered every format (its readers) before this runs.
from sieverag.inference.data.formats import DATASET_FORMATS


def dataset_field() -> Any:
    """The required `dataset`: whatever `load_examples` opens."""
    return field(metadata={
        "help": "the dataset: a file (jsonl, parquet, SQuAD's JSON or zip), a save_to_disk "
                "FOLDER[:SPLIT] or hf:NAME[:CONFIG]:SPLIT (see docs/data-formats.md)"})


def dataset_format_field() -> Any:
    """`dataset_format`, default auto: the registered format names, or detection."""
    return field(default="auto", metadata={
        "help": "the dataset's format (" + ", ".join(sorted(DATASET_FORMATS)) + ") or auto: "
                "detected from its name, else from its first record's keys"})


def limit_field() -> Any:
    """`limit`, default None (every question)."""
    return field(default=None, metadata={
        "help": "first N questions of each dataset only (default: all)"})
