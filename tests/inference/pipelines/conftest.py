"""Fixtures shared by the pipeline tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sieverag.inference.pipelines import PIPELINES
from sieverag.inference.pipelines.pipeline_registry import PipelineEntry


@pytest.fixture()
def registry() -> Iterator[dict[str, PipelineEntry]]:
    """The pipeline registry; the pipelines a test adds (named test-*) leave with it."""
    yield PIPELINES
    for name in [n for n in PIPELINES if n.startswith("test-")]:
        del PIPELINES[name]
