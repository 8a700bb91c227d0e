"""Trust metrics across a run: not-applicable values left out of the means (and counted),
the LLM grader's every criterion, the per-kind table and the per-question Δ(auto − direct)."""

from __future__ import annotations

import pytest

from sieverag.inference.eval.report import (
    delta_table,
    delta_tables,
    kind_tables,
    trust_counts_line,
)
from sieverag.inference.eval.result_records import (
    AnswerMetrics,
    EvalRecord,
    GraderGrades,
    TrustMetrics,
)
from sieverag.inference.eval.summary import summarize


def trust(retrieved: bool, quality: float, taas: float, faithful: float | None = None,
          graded: GraderGrades | None = None) -> TrustMetrics:
    grounding = faithful if retrieved else None
    return TrustMetrics(
        retrieved=retrieved, answer_quality=quality, taas=taas, sentence_taas=taas,
        faithfulness=grounding,
        hallucination_rate=None if grounding is None else 1 - grounding,
        sentence_similarity=grounding, sentence_support_rate=grounding,
        unsupported_sentence_rate=None if grounding is None else 1 - grounding,
        context_precision=grounding, evidence_noise=grounding, lexical_context_use=grounding,
        context_precision_gold=None, llm_grader=graded)


def record(question_id: str, kind: str, trust_metrics: TrustMetrics,
           accuracy: float = 0.0) -> EvalRecord:
    read = ["d1"] if trust_metrics.retrieved else []
    return EvalRecord(
        id=question_id, question="q?", answers=["a"], kind=kind, prediction="p",
        raw_prediction="p", metrics=AnswerMetrics(em=0.0, f1=0.0, accuracy=accuracy),
        documents_read=read, contexts=["text"] * len(read), documents_given=0,
        read_scores=None, usage={}, llm_calls=1, input_tokens=10, generator_input_tokens=10,
        seconds=0.1, trust=trust_metrics)


def grades(grounding: int | None, risk: int) -> GraderGrades:
    return GraderGrades(correctness=4, relevance=5, completeness=3,
                        evidence_grounding=grounding, hallucination_risk=risk, overall=4,
                        error=None)


INVALID = GraderGrades(correctness=None, relevance=None, completeness=None,
                       evidence_grounding=None, hallucination_risk=None, overall=None,
                       error="no JSON object in the reply")

# auto: q1 retrieved, q2 and q3 answered alone; direct: nothing retrieved
AUTO = [record("q1", "factual", trust(True, 0.8, 0.7, 0.6, grades(4, 1)), accuracy=1.0),
        record("q2", "factual", trust(False, 0.5, 0.5, graded=grades(None, 2))),
        record("q3", "conceptual", trust(False, 0.2, 0.2, graded=INVALID))]
DIRECT = [record("q1", "factual", trust(False, 0.4, 0.4)),
          record("q2", "factual", trust(False, 0.5, 0.5)),
          record("q3", "conceptual", trust(False, 0.3, 0.3))]


def test_grounding_means_leave_out_answers_without_retrieval_and_say_how_many() -> None:
    summary = summarize(AUTO)
    assert summary["faithfulness"] == 0.6  # q1 alone: q2, q3 are not applicable, not 0
    assert summary["hallucination_rate"] == pytest.approx(0.4)
    assert summary["trust_counts"]["faithfulness"] == 1
    assert summary["trust_counts"]["taas"] == 3
    assert summary["taas"] == round((0.7 + 0.5 + 0.2) / 3, 4)  # means are rounded to 4
    assert summary["retrieval_usage_rate"] == round(1 / 3, 4)
    assert summarize(DIRECT)["faithfulness"] is None
    assert "auto: 1 of 3" in trust_counts_line({"auto": summary})


def test_the_sentence_taas_is_its_own_mean_beside_the_studys_taas() -> None:
    """An answer without a sentence TAAS (no reference) is left out of its mean, not 0."""
    sentence = [record("q1", "factual", trust(True, 0.8, 0.7, 0.6).model_copy(
                    update={"sentence_taas": 0.75})),
                record("q2", "factual", trust(False, 0.5, 0.5).model_copy(
                    update={"sentence_taas": 0.5})),
                record("q3", "conceptual", trust(False, 0.2, 0.2).model_copy(
                    update={"sentence_taas": None}))]
    summary = summarize(sentence)
    assert summary["taas"] == round((0.7 + 0.5 + 0.2) / 3, 4)
    assert summary["sentence_taas"] == 0.625
    assert summary["trust_counts"]["sentence_taas"] == 2


def test_every_grader_criterion_is_aggregated_with_its_invalid_replies() -> None:
    summary = summarize(AUTO)
    assert summary["grader_correctness"] == 4.0
    assert summary["grader_evidence_grounding"] == 4.0  # q1 only: N/A for q2
    assert summary["grader_hallucination_risk"] == 1.5  # lower is better
    assert summary["grader_overall"] == 4.0
    assert summary["grader_invalid"] == 1


def test_by_kind_is_the_studys_table_5() -> None:
    summary = summarize(AUTO)
    factual = summary["by_kind"]["factual"]
    assert factual["examples"] == 2 and factual["accuracy"] == 0.5
    assert factual["taas"] == pytest.approx(0.6) and factual["retrieval_usage_rate"] == 0.5
    assert summary["by_kind"]["conceptual"]["faithfulness"] is None
    table = "\n".join(kind_tables({"auto": summary, "direct": summarize(DIRECT)}))
    assert "### factual" in table and "### conceptual" in table
    assert "| auto | 2 |" in table and "| direct | 1 |" in table


def test_delta_auto_minus_direct_per_question_and_kind() -> None:
    # `auto` declares the pipeline it compares with (`compares_with`): the report's tables.
    assert delta_tables({"auto": AUTO, "direct": DIRECT}) == delta_table(
        {"auto": AUTO, "direct": DIRECT}, "auto", "direct")
    table = "\n".join(delta_tables({"auto": AUTO, "direct": DIRECT}))
    # TAAS Δ: q1 +0.3, q2 0, q3 −0.1 → mean 0.0667; 1 win, 1 tie, 1 loss
    assert "| all | 3 | 0.067 | 1/1/1 |" in table
    assert "| factual | 2 | 0.150 | 1/1/0 |" in table
    assert "| conceptual | 1 | -0.100 | 0/0/1 |" in table
    assert delta_tables({"auto": AUTO}) == [] == delta_table({"auto": AUTO}, "auto", "direct")
