"""Fixtures shared by the training tests (the session-wide ones are in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sft_runs import write_filter_dataset


@pytest.fixture(scope="module")
def filter_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `build-dataset`-shaped folder with a train and a validation split (one per module)."""
    return write_filter_dataset(tmp_path_factory.mktemp("filter-data"))
