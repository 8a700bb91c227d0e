"""A stored trace is read as the model its keys match among those the pipelines declare
(`traces.trace_model`), and a declaration that would make stored traces ambiguous is refused
where the pipeline registers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.io_utils import JsonlRecord
from sieverag.inference.pipelines.amber.loop_trace import AmberTrace
from sieverag.inference.pipelines.pipeline_registry import PipelineEntry, register_pipeline
from sieverag.inference.pipelines.traces import (
    OpenTrace,
    PipelineTrace,
    TraceDeclaration,
    trace_model,
)


class Steps(PipelineTrace):
    steps: list[str]
    queries: list[str] = []


class Queries(PipelineTrace):
    queries: list[str]


class Gate(PipelineTrace):
    gate: bool

    def retrieval_decision(self) -> bool:
        return self.gate


DECLARED = [TraceDeclaration(Steps, str), TraceDeclaration(Queries, str),
            TraceDeclaration(Gate, str, beside_inner=True)]


@pytest.mark.parametrize(("keys", "expected"), [
    ({"steps", "queries"}, (Steps,)), ({"queries"}, (Queries,)),  # no required key missing
    ({"steps"}, (Steps,)), ({"queries", "step"}, (Queries,)),  # a renamed key: still Queries
    ({"gate"}, (Gate,)), ({"gate", "steps"}, (Gate, Steps)),  # beside: one model of both
    ({"gate", "other"}, (Gate, OpenTrace)), ({"other"}, (OpenTrace,)), (set(), (OpenTrace,)),
])
def test_a_trace_is_read_as_the_declared_model_its_keys_match(keys: set[str],
                                                              expected: tuple[type, ...]) -> None:
    model = trace_model(dict.fromkeys(keys), DECLARED)
    assert (model,) == expected if len(expected) == 1 else model.__bases__ == expected
    assert model is trace_model(dict.fromkeys(keys), DECLARED)  # built once


def test_the_joined_model_reads_and_writes_the_trace_as_it_is() -> None:
    data = {"steps": ["a"], "gate": False}
    trace = trace_model(data, DECLARED).model_validate(data)
    assert trace.to_json() == data and trace.retrieval_decision() is False
    with pytest.raises(ValidationError, match=r"step\n\s+Extra inputs"):
        trace_model({"queries": [], "step": 1}, DECLARED).model_validate(
            {"queries": [], "step": 1})
    open_one = {"gate": True, "anything": [1, {"a": None}]}
    assert trace_model(open_one, DECLARED).model_validate(open_one).to_json() == open_one


def test_a_trace_declaration_that_would_make_stored_traces_ambiguous_is_refused(
        registry: dict[str, PipelineEntry]) -> None:
    class Routed(PipelineTrace):
        route: str  # auto's route sits beside the trace of the pipeline it runs

    with pytest.raises(ConfigError, match=r"shares the key\(s\) \['route'\] with RouteTrace"):
        register_pipeline("test-routed", trace=Routed, render_trace=str)
    with pytest.raises(ConfigError, match="'test-bare' declares a trace without its renderer"):
        register_pipeline("test-bare", trace=Routed)
    with pytest.raises(ConfigError, match="JsonlRecord, which is not a PipelineTrace"):
        register_pipeline("test-plain", trace=JsonlRecord, render_trace=str)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="AmberTrace with another renderer"):
        register_pipeline("test-amber-like", trace=AmberTrace, render_trace=str)
    assert not [name for name in registry if name.startswith("test-")]
