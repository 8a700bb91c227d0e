"""A pipeline declares what it needs where it is registered, and composition reads the
declarations: a new pipeline that reads no documents, or filters with the trained filter, is
composed right without any other file naming it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sieverag.inference import compose
from sieverag.inference.config import RunConfig
from sieverag.inference.errors import ConfigError
from sieverag.inference.pipelines import PIPELINES
from sieverag.inference.pipelines.amber_config import AmberConfig
from sieverag.inference.pipelines.base import PipelineEntry, pipeline_entry, register_pipeline


@pytest.fixture()
def registry() -> Iterator[dict[str, PipelineEntry]]:
    """The registry; the pipelines a test adds (named test-*) leave with it."""
    yield PIPELINES
    for name in [n for n in PIPELINES if n.startswith("test-")]:
        del PIPELINES[name]


def test_a_new_pipeline_is_composed_from_its_declaration(
    registry: dict[str, PipelineEntry]
) -> None:
    @register_pipeline("test-closed-book", reads_documents=False)
    class ClosedBook:
        name = "test-closed-book"

    @register_pipeline("test-trained", filter_stage=lambda amber: "mcf")
    class Trained:
        name = "test-trained"

    closed = RunConfig(dataset="d", pipelines=("test-closed-book",))
    assert not compose.needs_given_documents(closed)
    assert not compose.needs_trained_filter(closed)
    trained = RunConfig(dataset="d", pipelines=("test-closed-book", "test-trained"))
    assert compose.needs_given_documents(trained) and compose.needs_trained_filter(trained)
    # `auto` runs its routed pipeline: that one's needs count.
    routed = RunConfig(dataset="d", pipelines=("auto",), routed_pipeline="test-trained")
    assert compose.run_pipelines(routed) == {"auto", "test-trained"}
    assert compose.needs_given_documents(routed) and compose.needs_trained_filter(routed)


@pytest.mark.parametrize(("pipeline", "amber_filter", "trained", "documents"), [
    ("direct", "mcf", False, False), ("vanilla", "mcf", False, True),
    ("main-rag", "mcf", False, True), ("amber", "judge", False, True),
    ("amber", "stack", True, True), ("amber-mcf", "judge", True, True),
    ("amber-no-amu", "mcf", True, True), ("amber-judge", "mcf", False, True)])
def test_the_shipped_pipelines_declare_their_needs(pipeline: str, amber_filter: str,
                                                   trained: bool, documents: bool) -> None:
    config = RunConfig(dataset="d", pipelines=(pipeline,), amber=AmberConfig(filter=amber_filter))
    assert compose.needs_trained_filter(config) is trained
    assert compose.needs_given_documents(config) is documents


def test_an_unknown_pipeline_is_one_error_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown pipeline 'nope' .*amber-mcf"):
        pipeline_entry("nope")
    with pytest.raises(ConfigError, match="unknown pipeline 'nope'"):
        compose.needs_trained_filter(RunConfig(dataset="d", pipelines=("nope",)))
