"""Typed records at the module boundaries: an eval record (with amber's trace, auto's route,
the filters' details and the trust metrics) is written and read back unchanged, and a
renamed or missing key in a results line is an error naming the file, the line and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_backend import ScriptedBackend
from pydantic import ValidationError
from scripted_amber import EXAMPLE, Agents

from sieverag.inference.composition.config import TrustConfig
from sieverag.inference.core.errors import DatasetError
from sieverag.inference.core.io_utils import JsonlLog
from sieverag.inference.eval.result_records import EvalRecord, build_record, trust_metrics
from sieverag.inference.eval.trace_rendering import find_record, render_trace
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.inference.llm.backend_protocol import Usage
from sieverag.inference.pipelines import PipelineContext, PipelineSettings, build_pipeline
from sieverag.inference.pipelines.amber.config import AmberConfig
from sieverag.inference.pipelines.amber.loop_trace import AmberTrace, render_amber_trace
from sieverag.inference.pipelines.auto import AutoConfig, RouteTrace
from sieverag.inference.pipelines.auto.retrieval_router import Router, RouterConfig
from sieverag.inference.pipelines.traces import OpenTrace

GRADES = json.dumps({"correctness": 4, "relevance": 5, "completeness": 3,
                     "evidence_grounding": 4, "hallucination_risk": 5, "overall": 4})


def records(pipeline: str, *, retrieve: bool = True) -> list[EvalRecord]:
    """One record of `pipeline` on the scripted agents, with the trust metrics and grader."""
    backend = ScriptedBackend(reply=lambda text: GRADES if "overall" in text else
                              Agents().reply(text), labels=Agents().labels)
    # The sentence stage and the stack write every filter detail; the router's bars decide.
    router = Router(RouterConfig(rule="corpus-match", long_query_tokens=1 if retrieve else 1000,
                                 min_entity_words=0))
    context = PipelineContext(generator=backend, judge_backend=backend, mcf_backend=backend,
                              settings=PipelineSettings([
                                  MCFConfig(sentence_stage=True), AmberConfig(k=4),
                                  AutoConfig(routed_pipeline="amber-stack")]),
                              parts={"auto": router})
    output = build_pipeline(pipeline, context).run(EXAMPLE)
    record = build_record(EXAMPLE, output, {"generator": Usage(1, 30, 4)}, 0.123456)
    record.trust = trust_metrics(EXAMPLE, output, None, TrustConfig(), backend)
    return [record]


@pytest.mark.parametrize(("pipeline", "retrieve", "trace"), [
    ("amber-stack", True, AmberTrace), ("auto", True, AmberTrace),
    ("auto", False, RouteTrace), ("main-rag", True, type(None))])
def test_a_record_is_read_back_unchanged(tmp_path: Path, pipeline: str, retrieve: bool,
                                         trace: type) -> None:
    (record,) = records(pipeline, retrieve=retrieve)
    assert isinstance(record.trace, trace)
    written = record.to_json()
    log = JsonlLog(tmp_path / f"{pipeline}.jsonl")
    log.append(written)
    (read,) = log.read_records(EvalRecord)
    assert read.to_json() == written and read == record
    # The line holds the keys the readers know: optional ones only where a writer set them.
    line = json.loads(log.path.read_text(encoding="utf-8"))
    assert line == written and json.dumps(read.to_json()) == json.dumps(line)
    assert ("filter" in line) == (pipeline != "auto" or retrieve)
    assert set(line["trust"]) >= {"faithfulness", "llm_grader"}
    assert line["trust"]["answer_quality"] is None  # no embedding model: null, not a guess
    assert line["trust"]["llm_grader"]["overall"] == 4
    if pipeline == "amber-stack":
        scored = line["trace"]["rounds"][0]["scored"][0]
        assert {"title", "p_yes", "filter_score", "bm25", "mcf_score", "judge_kept",
                "predicted_answer"} <= set(scored) and "route" not in line["trace"]
        assert "title" not in line["filter"]["scores"][0]
        assert any("sentence_status" in s for s in line["trace"]["rounds"][0]["scored"])
    if pipeline == "auto":
        assert line["trace"]["route"]["retrieve"] is retrieve
        # The route beside the routed pipeline's trace: one model, an instance of both.
        assert isinstance(read.trace, RouteTrace) and read.trace.route.retrieve is retrieve
        assert read.trace.retrieval_decision() is retrieve
        assert ("rounds" in line["trace"]) is retrieve
    # `sieverag ask --trace` renders a pipeline output's JSON trace as it is, each part by
    # the renderer its pipeline declares.
    if record.trace is not None:
        shown = render_trace(written["trace"])
        assert shown == render_trace(record.trace)
        if isinstance(record.trace, AmberTrace):
            assert render_amber_trace(record.trace) in shown
        assert ("Router: " in shown) is (pipeline == "auto")


def write_results(run: Path, lines: list[dict]) -> Path:
    path = run / "results" / "amber-stack.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_a_renamed_or_missing_key_names_the_file_line_and_key(tmp_path: Path) -> None:
    good = records("amber-stack")[0].to_json()
    renamed = {("predicted" if k == "prediction" else k): v for k, v in good.items()}
    path = write_results(tmp_path, [good, renamed])
    with pytest.raises(DatasetError) as error:
        JsonlLog(path).read_records(EvalRecord)
    message = str(error.value)
    assert f"{path}, line 2: not a valid EvalRecord" in message
    assert "predicted: unknown key" in message and "prediction: missing key" in message
    # `sieverag trace` reads the same way: a broken line before the question is named too.
    with pytest.raises(DatasetError, match=r"line 2: .*prediction: missing key"):
        find_record(tmp_path, "no such id", "amber-stack")
    assert find_record(tmp_path, EXAMPLE.id, "amber-stack").to_json() == good


@pytest.mark.parametrize(("change", "named"), [
    (lambda r: r["trace"]["rounds"][0].pop("skipped_seen"),
     "trace.rounds.0.skipped_seen: missing key"),
    (lambda r: r["trace"]["rounds"][0]["scored"][0].update(bm_25=1.0),
     "trace.rounds.0.scored.0.bm_25: unknown key"),
    (lambda r: r["trace"].update(stop="sufficient"), "trace.stop: unknown key"),
    (lambda r: r["filter"]["scores"][1].pop("kept"), "filter.scores.1.kept: missing key"),
    (lambda r: r["usage"]["generator"].update(calls="many"),
     "usage.generator.calls: Input should be a valid integer"),
    (lambda r: r["trust"].update(trust=0.5), "trust.trust: unknown key"),
])
def test_a_bad_nested_key_is_named_by_its_place(tmp_path: Path, change, named: str) -> None:
    line = records("amber-stack")[0].to_json()
    change(line)
    path = write_results(tmp_path, [line])
    with pytest.raises(DatasetError, match=rf"{path}, line 1: .*{named}"):
        JsonlLog(path).read_records(EvalRecord)


def test_a_trace_with_any_amber_key_must_be_amber_s_whole_trace() -> None:
    """A renamed amber key is an error, not another pipeline's open trace; a trace no
    declared model has a key of is open (JSON values), also beside auto's route."""
    line = records("amber-stack")[0].to_json()
    line["trace"]["round"] = line["trace"].pop("rounds")
    with pytest.raises(ValidationError, match=r"trace\.rounds\n\s+Field required"):
        EvalRecord.model_validate(line)
    route = records("auto", retrieve=False)[0].to_json()["trace"]["route"]
    for trace in ({"steps": [1, {"a": None}]}, {"route": route, "steps": [1, {"a": None}]}):
        line["trace"] = trace
        other = EvalRecord.model_validate(line)
        assert isinstance(other.trace, OpenTrace) and other.trace.model_extra["steps"]
        assert isinstance(other.trace, RouteTrace) is ("route" in trace)
        assert other.to_json()["trace"] == trace
    line["trace"] = {"route": None}  # a route is the router's decision, never null
    with pytest.raises(ValidationError, match=r"trace\.route\n\s+Input should be"):
        EvalRecord.model_validate(line)
