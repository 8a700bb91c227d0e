"""`iter-retgen`: the next query is the question plus the last answer, each iteration reads its
own top-k, the last answer is the answer, and the trace and `documents_read` show it all."""

from __future__ import annotations

import pytest
from fake_backend import ScriptedBackend

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.types import Document, Example
from sieverag.inference.eval.result_records import EvalRecord, build_record
from sieverag.inference.pipelines import PipelineContext, PipelineSettings, build_pipeline
from sieverag.inference.pipelines.iter_retgen import (
    IterRetGenConfig,
    IterRetGenTrace,
    next_query,
    render_iterations,
)

POOL = (
    Document(id="d0", title="Liora Tamsin", text="Liora Tamsin was born in Quorrin.",
             is_gold=True),
    Document(id="d1", title="Penguins", text="Penguins huddle in winter.", is_gold=False),
    Document(id="d2", title="Quorrin", text="Quorrin lies on the river Calder.", is_gold=True),
    Document(id="d3", title="Bridges", text="Bridges cross rivers.", is_gold=False),
)
EXAMPLE = Example(id="q", question="On which river is Liora Tamsin's birthplace?",
                  answers=("Calder",), documents=POOL)


def reply(text: str) -> str:
    # The first iteration reads about Liora's birth, the second about Quorrin.
    return "The river Calder." if "lies on the river" in text else "Quorrin."


def test_each_iteration_queries_with_the_last_answer_and_the_last_answer_wins():
    backend = ScriptedBackend(reply=reply)
    context = PipelineContext(generator=backend, judge_backend=backend,
                              settings=PipelineSettings([IterRetGenConfig(k=2, iterations=2)]))
    output = build_pipeline("iter-retgen", context).run(EXAMPLE)
    iterations = output.trace["iterations"]
    assert [i["query"] for i in iterations] == [
        EXAMPLE.question, f"{EXAMPLE.question} Quorrin"]
    # BM25 over the given pool: the answer "Quorrin" brings Quorrin's page into the top 2.
    assert [i["retrieved"] for i in iterations] == [["d0", "d3"], ["d0", "d2"]]
    assert output.answer == "The river Calder"
    assert [d.id for d in output.documents_read] == ["d0", "d3", "d2"]
    assert [agent for agent, _ in backend.calls] == ["generator", "generator"]
    record = build_record(EXAMPLE, output, {}, 0.1)
    assert record.read_scores is not None and record.read_scores.recall == 1.0
    # The trace is not mistaken for amber's and survives the jsonl round trip.
    # Read back as its declared trace, which `sieverag trace` renders by iteration.
    trace = EvalRecord.model_validate(record.to_json()).trace
    assert isinstance(trace, IterRetGenTrace) and len(trace.iterations) == 2
    shown = render_iterations(trace)
    assert "Iteration 1 — query: " in shown and "Iteration 2 — query: " in shown


def test_an_index_search_is_used_and_documents_are_not_deduplicated():
    searched = []

    def search(query: str, k: int) -> list[Document]:
        searched.append((query, k))
        return [Document(id="c#0", text=POOL[0].text, title=POOL[0].title)]

    backend = ScriptedBackend(reply=lambda text: "Quorrin.")
    context = PipelineContext(generator=backend, judge_backend=backend, search=search,
                              settings=PipelineSettings([IterRetGenConfig(k=3, iterations=3)]))
    output = build_pipeline("iter-retgen", context).run(EXAMPLE)
    assert searched == [(EXAMPLE.question, 3)] + [(f"{EXAMPLE.question} Quorrin", 3)] * 2
    assert [i["retrieved"] for i in output.trace["iterations"]] == [["c#0"]] * 3
    # The index chunk carries its source passage's gold mark; it is read once.
    assert [(d.id, d.is_gold) for d in output.documents_read] == [("c#0", True)]
    assert next_query("Q?", "") == "Q?"
    with pytest.raises(ConfigError, match="iter_retgen.k"):
        IterRetGenConfig(k=0)
