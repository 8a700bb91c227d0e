"""`main-rag` and `main-rag-naive` with a scripted backend: every agent reads a
multiple-choice question's options (amber's filters too), the reading order reaches Agent-3,
and `main-rag-naive` runs through `sieverag eval` with its verdicts in the records."""

from __future__ import annotations

import json
import zlib

import pytest
from fake_backend import ScriptedBackend, serve_every_role

from sieverag.cli import main
from sieverag.inference.composition.config import TrustConfig
from sieverag.inference.core.types import Document, Example
from sieverag.inference.data.demo import write_demo_dataset
from sieverag.inference.eval.result_records import trust_metrics
from sieverag.inference.filters.judge import JudgeConfig
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.inference.pipelines import PipelineContext, PipelineSettings, build_pipeline
from sieverag.inference.pipelines.amber.config import AmberConfig

OPTIONS = {"A": "Planetary density will decrease.", "B": "Planetary years will become longer.",
           "C": "Planetary days will become shorter.", "D": "Planetary gravity will grow."}
ARC = Example(
    id="Mercury_7175875",
    question="A planet rotates faster after a meteorite impact. Which is the most likely "
             "effect of this increase in rotation?",
    answers=("Planetary days will become shorter.",), choices=OPTIONS, answer_key="C",
    documents=(Document(id="d1", text="A day is one rotation of a planet.", is_gold=True),
               Document(id="d2", text="Meteorites are rocks from space.", is_gold=False),
               Document(id="d3", text="Faster rotation makes days shorter.", is_gold=True)))


def scripted() -> ScriptedBackend:
    """Replies "C"; judge scores differ per document (a checksum of the prompt)."""
    return ScriptedBackend(reply=lambda text: "C", labels=lambda text: {
        "Yes": -(zlib.crc32(text.encode()) % 100) / 10, "No": -5.0})


def prompts_of(backend: ScriptedBackend, agent: str) -> list[str]:
    return [text for name, text in backend.calls if name == agent]


@pytest.mark.parametrize("pipeline", ["main-rag", "main-rag-naive"])
def test_every_agent_reads_the_options_of_a_multiple_choice_question(pipeline):
    backend = scripted()
    context = PipelineContext(generator=backend, judge_backend=backend)
    build_pipeline(pipeline, context).run(ARC)
    for agent in ("predictor", "judge", "generator"):
        prompts = prompts_of(backend, agent)
        assert prompts, agent
        assert all(option in text for text in prompts for option in OPTIONS.values()), agent


@pytest.mark.parametrize(("pipeline", "agents"), [
    ("amber-judge", ("predictor", "judge")), ("amber-mcf", ("filter_chunk",))])
def test_amber_filters_read_the_options_and_its_query_stays_the_plain_question(pipeline, agents):
    backend = scripted()
    # MCF asked to score every chunk with the filter (no card: BM25 + dense rank alone).
    context = PipelineContext(generator=backend, judge_backend=backend, mcf_backend=backend,
                              settings=PipelineSettings([AmberConfig(k=3, max_iterations=1),
                                                         MCFConfig(always_score_chunks=True)]))
    output = build_pipeline(pipeline, context).run(ARC)
    for agent in agents:
        prompts = prompts_of(backend, agent)
        assert len(prompts) == 3
        assert all(option in text for text in prompts for option in OPTIONS.values()), agent
    assert output.trace["queries"] == [ARC.question]


def test_the_llm_grader_of_the_trust_metrics_reads_the_options_too():
    backend = scripted()
    context = PipelineContext(generator=backend, judge_backend=backend)
    output = build_pipeline("main-rag", context).run(ARC)
    trust_metrics(ARC, output, None, TrustConfig(), backend)
    (graded,) = prompts_of(backend, "grader")
    assert all(option in graded for option in OPTIONS.values())


@pytest.mark.parametrize("order", ["descending", "ascending", "random"])
def test_the_generator_reads_the_kept_documents_in_the_judge_order(order):
    backend = scripted()
    context = PipelineContext(generator=backend, judge_backend=backend,
                              settings=PipelineSettings([JudgeConfig(bar_n=2, order=order)])
                              )  # keeps all three
    output = build_pipeline("main-rag", context).run(ARC)
    scores = {s.document.id: s.score for s in output.filter_result.scored}
    read = [d.id for d in output.documents_read]
    assert sorted(read) == ["d1", "d2", "d3"]
    if order == "descending":
        assert read == sorted(scores, key=lambda i: -scores[i])
    elif order == "ascending":
        assert read == sorted(scores, key=lambda i: scores[i])
    else:  # the same shuffle on every run of the question
        again = build_pipeline("main-rag", context).run(ARC)
        assert [d.id for d in again.documents_read] == read
    generated = prompts_of(backend, "generator")[0]
    texts = {d.id: d.text for d in ARC.documents}
    assert [generated.index(texts[i]) for i in read] == sorted(
        generated.index(texts[i]) for i in read)


def fake_roles(monkeypatch, backend: ScriptedBackend) -> None:
    """Every role of a run is `backend` (no model loads)."""
    serve_every_role(monkeypatch, backend)


def test_main_rag_naive_runs_through_sieverag_eval_with_its_verdicts_recorded(
        tmp_path, monkeypatch, capsys):
    verdicts = iter(["Yes", "no", " yes.", "Nope", "YES it is"] * 20)
    backend = ScriptedBackend(reply=lambda text: (
        next(verdicts) if "noisy-document evaluator" in text else "Mara Quill"))
    fake_roles(monkeypatch, backend)
    dataset = write_demo_dataset(tmp_path / "demo.jsonl")
    out = tmp_path / "run"
    assert main(["eval", "--dataset", str(dataset), "--pipelines", "main-rag,main-rag-naive",
                 "--limit", "2", "--no-trust.enabled", "--quiet", "--out", str(out)]) == 0
    assert "| main-rag-naive | 2 |" in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "results" / "main-rag-naive.jsonl").open()]
    first = records[0]
    # Yes, no, yes., Nope, YES it is: documents 1, 3 and 5 kept, in retrieved order.
    assert [s["verdict"] for s in first["filter"]["scores"]] == ["Yes", "no", "yes.", "Nope",
                                                                  "YES it is"]
    assert [s["score"] for s in first["filter"]["scores"]] == [1.0, 0.0, 1.0, 0.0, 1.0]
    scored_ids = [s["id"] for s in first["filter"]["scores"]]
    assert first["documents_read"] == scored_ids[0::2]
    assert first["filter"]["threshold"] is None
    assert first["usage"]["judge"]["completion_tokens"] > 0  # Agent-2 generated
    # Verdicts are not plotted as judge scores; main-rag's scores are.
    assert not (out / "judge_scores_main-rag-naive.png").exists()
    assert (out / "judge_scores_main-rag.png").exists()
    assert main(["trace", str(out), first["id"], "--pipeline", "main-rag-naive"]) == 0
    assert "verdict 'Nope'" in capsys.readouterr().out
