"""MAIN-RAG judge: bar arithmetic, r = log P(Yes) − log P(No), keep/order, batching; the
reading orders; the naive judge's generated verdicts."""

from __future__ import annotations

import math

import pytest
from fake_backend import ScriptedBackend

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.types import Document
from sieverag.inference.filters.document_filter import ScoredDocument
from sieverag.inference.filters.judge import JudgeConfig, MainRagJudge, judge_bar, reading_order
from sieverag.inference.filters.naive_judge import NaiveJudge


def test_judge_bar_is_mean_minus_n_population_std():
    scores = [1.0, 2.0, 3.0, 6.0]  # mean 3, population std sqrt(3.5)
    assert judge_bar(scores, 0) == pytest.approx(3.0)
    assert judge_bar(scores, 1) == pytest.approx(3.0 - math.sqrt(3.5))
    assert judge_bar(scores, -0.5) == pytest.approx(3.0 + 0.5 * math.sqrt(3.5))
    assert judge_bar([2.5], 1) == 2.5
    with pytest.raises(ValueError):
        judge_bar([], 0)


def test_judge_keeps_scores_at_or_above_the_bar_ordered_best_first():
    yes = {"alpha": -0.1, "beta": -3.0, "gamma": -1.0, "delta": -2.0}
    backend = ScriptedBackend(
        reply=lambda text: "pred",
        labels=lambda text: next({"Yes": v, "No": -1.5} for k, v in yes.items() if k in text),
    )
    documents = [Document(id=k, text=f"text {k}") for k in yes]
    result = MainRagJudge(backend).select("q?", documents)
    scores = {s.document.id: s.score for s in result.scored}
    assert scores == pytest.approx({k: v + 1.5 for k, v in yes.items()})
    assert result.threshold == pytest.approx(sum(scores.values()) / 4)
    assert [s.document.id for s in result.kept] == ["alpha", "gamma"]
    assert all(s.details["predicted_answer"] == "pred" for s in result.scored)
    # One batched predictor call and one batched judge call for the four documents.
    agents = [agent for agent, _ in backend.calls]
    assert agents == ["predictor"] * 4 + ["judge"] * 4
    assert backend.meter.by_agent["predictor"].calls == 4


def test_larger_n_lowers_the_bar_and_keeps_more():
    backend = ScriptedBackend(labels=lambda text: {"Yes": float(len(text) % 7), "No": 0.0})
    documents = [Document(id=str(i), text="x" * i) for i in range(1, 8)]
    strict = MainRagJudge(backend, JudgeConfig(bar_n=0)).select("q", documents)
    loose = MainRagJudge(backend, JudgeConfig(bar_n=1)).select("q", documents)
    assert len(loose.kept) >= len(strict.kept) and loose.threshold < strict.threshold


def test_judge_prompt_carries_question_document_and_predicted_answer():
    backend = ScriptedBackend(reply=lambda text: "Paris")
    judge = MainRagJudge(backend)
    judge.select("Capital of France?", [Document(id="d", text="Paris is big.")])
    judge_prompt = [text for agent, text in backend.calls if agent == "judge"][0]
    assert "Capital of France?" in judge_prompt and "Paris is big." in judge_prompt
    assert "noisy-document evaluator" in judge_prompt
    conversation = judge.judge_messages("Capital of France?", Document(id="d", text="x"), "Paris")
    assert [m["role"] for m in conversation] == ["system", "user", "assistant", "user"]
    assert conversation[2]["content"] == "Paris"


def test_no_documents_keeps_nothing_without_calls():
    backend = ScriptedBackend()
    result = MainRagJudge(backend).select("q", [])
    assert result.kept == () and result.threshold is None and backend.calls == []


def test_judge_prompt_continues_the_predictor_conversation(tiny_model_dir):
    """Agent-2's prompt starts with Agent-1's exact prompt tokens (so a prefix cache serves
    the document once), whatever the predicted answer looks like."""
    from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

    hf = HFBackend(HFBackendConfig(model=str(tiny_model_dir)))
    judge = MainRagJudge(hf)
    document = Document(id="d", title="Paris", text="Paris is the capital of France.")
    predictor = hf.prompt_ids(judge.predictor_prompt.messages(
        question="Capital of France?", document=document.as_context()))
    for answer in ("Paris", "", " 1901.", "\"Paris\"", "no idea\n"):
        full = hf.prompt_ids(judge.judge_messages("Capital of France?", document, answer))
        assert full[:len(predictor)] == predictor and len(full) > len(predictor) + 10


# Scores r of four documents (Yes log-prob + 1.5; No is -1.5): the mean bar keeps three.
ORDERED = {"alpha": -0.1, "beta": -3.0, "gamma": -1.0, "delta": -0.5}


def ordered_judge(order: str, seed: int = 0) -> tuple[MainRagJudge, list[Document]]:
    backend = ScriptedBackend(
        labels=lambda text: next({"Yes": v, "No": -1.5} for k, v in ORDERED.items() if k in text))
    documents = [Document(id=k, text=f"text {k}") for k in ORDERED]
    return MainRagJudge(backend, JudgeConfig(order=order, seed=seed)), documents


@pytest.mark.parametrize(("order", "expected"), [
    ("descending", ["alpha", "delta", "gamma"]), ("ascending", ["gamma", "delta", "alpha"])])
def test_kept_documents_reach_agent_3_in_the_chosen_score_order(order, expected):
    judge, documents = ordered_judge(order)
    result = judge.select("q?", documents)
    assert [s.document.id for s in result.kept] == expected
    # The record keeps every score in retrieved order, whatever the reading order.
    assert [s.document.id for s in result.scored] == list(ORDERED)
    assert [s.kept for s in result.scored] == [True, False, True, True]


def test_random_order_is_the_same_on_every_run_of_a_question_and_follows_the_seed():
    def order(question: str, seed: int) -> list[str]:
        judge, documents = ordered_judge("random", seed)
        return [s.document.id for s in judge.select(question, documents).kept]

    assert sorted(order("q?", 0)) == ["alpha", "delta", "gamma"]
    assert order("q?", 0) == order("q?", 0)
    # Some seed or question shuffles differently: the order is not fixed.
    assert len({tuple(order(q, seed)) for q in ("q?", "r?", "s?") for seed in range(4)}) > 1
    # A sha256 of seed and question, not Python's salted hash(): these orders hold in any
    # process (recorded once; they change only if the seeding rule does).
    kept = [ScoredDocument(Document(id=f"d{i}", text="x"), float(i % 3), True)
            for i in range(6)]
    shuffled = {(q, seed): [s.document.id for s in reading_order(kept, "random", q, seed)]
                for q, seed in (("Who wrote Hamlet?", 0), ("Who wrote Hamlet?", 1))}
    assert shuffled == {("Who wrote Hamlet?", 0): ["d5", "d0", "d1", "d3", "d2", "d4"],
                        ("Who wrote Hamlet?", 1): ["d3", "d1", "d2", "d5", "d0", "d4"]}


def test_an_unknown_order_is_refused_by_name():
    with pytest.raises(ConfigError, match="order"):
        JudgeConfig(order="shuffled")


def test_naive_judge_keeps_documents_whose_generated_verdict_starts_with_yes():
    verdicts = {"alpha": " yes, it does", "beta": "No.", "gamma": "YES", "delta": "I think yes"}
    backend = ScriptedBackend(reply=lambda text: (
        next(v for k, v in verdicts.items() if k in text) if "noisy-document evaluator" in text
        else "pred"))
    documents = [Document(id=k, text=f"text {k}") for k in verdicts]
    result = NaiveJudge(backend, JudgeConfig(verdict_max_new_tokens=3)).select("q?", documents)
    # Kept in retrieved order; no score, no bar: 1.0 kept, 0.0 dropped, the reply beside it.
    assert [s.document.id for s in result.kept] == ["alpha", "gamma"]
    assert result.threshold is None
    assert [s.score for s in result.scored] == [1.0, 0.0, 1.0, 0.0]
    assert [s.details["verdict"] for s in result.scored] == ["yes, it does", "No.", "YES",
                                                             "I think yes"]
    assert all(s.details["predicted_answer"] == "pred" for s in result.scored)
    # Agent-2 generates on the scored judge's own conversation, and is never scored.
    judge_prompts = [text for agent, text in backend.calls if agent == "judge"]
    assert len(judge_prompts) == 4 and all("noisy-document evaluator" in t
                                           for t in judge_prompts)
    # Generated, not scored: the scripted backend counts 2 completion tokens per generation.
    assert backend.meter.by_agent["judge"].completion_tokens == 8


def test_naive_judge_without_documents_makes_no_call():
    backend = ScriptedBackend()
    result = NaiveJudge(backend).select("q", [])
    assert result.kept == () and result.scored == () and backend.calls == []
