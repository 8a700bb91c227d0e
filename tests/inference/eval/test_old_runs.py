"""A run folder written before the trust metrics took the Auto-RAG study's names (cosine
`faithfulness`, `hallucination_rate` = 1 − sentence support, `lexical_faithfulness`, TAAS
weights `faithfulness`/`grounding`; sentence-cosine `context_precision`, `evidence_noise` and
`sentence_support_rate`, now sieverag's own `sentence_*`) and before their answer-grading LLM
was named the grader (`trust.llm_judge`/`judge_model`, a record's `llm_judge` grades, a
summary's `llm_judge_*`) still loads, summarises, reports, collates and exports, under today's
names (inference/eval/migration.py, docs/compatibility.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sieverag.cli import main
from sieverag.inference.composition.config import (
    RunConfig,
    TAASWeights,
    TrustConfig,
    load_run_config,
)
from sieverag.inference.core.io_utils import JsonlLog
from sieverag.inference.eval.export import export_run
from sieverag.inference.eval.report import (
    GRADER_COLUMNS,
    TRUST_COLUMNS,
    comparison_table,
    read_run_summary,
    write_report,
)
from sieverag.inference.eval.result_records import EvalRecord, GraderGrades, TrustMetrics
from sieverag.inference.eval.summary import summarize
from sieverag.inference.llm.backend_registry import BackendSpec

OLD_CONFIG = """dataset: data/nutrition.jsonl
pipelines: [vanilla]
trust:
  taas: {quality: 0.5, faithfulness: 0.3, grounding: 0.2}
  llm_judge: true
  judge_model: {model: grader-model}
"""
OLD_GRADES = {"correctness": 4, "relevance": 5, "completeness": 3, "evidence_grounding": 4,
              "hallucination_risk": 2, "overall": 4, "error": None}
OLD_TRUST = {"retrieved": True, "answer_quality": 0.6, "faithfulness": 0.7,
             "hallucination_rate": 0.5, "sentence_support_rate": 0.5,
             "context_precision": 0.25, "evidence_noise": 0.5, "taas": 0.6,
             "lexical_faithfulness": 0.75, "lexical_context_use": 1.0,
             "context_precision_gold": None, "llm_judge": OLD_GRADES}
OLD_RECORD = {"id": "q1", "question": "Where is Paris?", "answers": ["France"],
              "kind": "factual", "prediction": "Paris is in France.",
              "raw_prediction": "Paris is in France.",
              "metrics": {"em": 0.0, "f1": 0.5, "accuracy": 1.0},
              "documents_read": ["d1"], "contexts": ["Paris is the capital of France."],
              "documents_given": 1, "read_scores": None,
              "usage": {"generator": {"calls": 1, "prompt_tokens": 30, "completion_tokens": 6}},
              "llm_calls": 1, "input_tokens": 30, "generator_input_tokens": 30, "seconds": 0.5,
              "trust": OLD_TRUST}
OLD_SUMMARY = {"examples": 1, "accuracy": 1.0, "answer_quality": 0.6, "taas": 0.6,
               "faithfulness": 0.7, "hallucination_rate": 0.5, "sentence_support_rate": 0.5,
               "context_precision": 0.25, "evidence_noise": 0.5,
               "lexical_faithfulness": 0.6667, "lexical_context_use": 1.0,
               "context_precision_gold": None,
               "trust_counts": {"answer_quality": 1, "taas": 1, "faithfulness": 1,
                                "hallucination_rate": 1, "sentence_support_rate": 1,
                                "context_precision": 1, "evidence_noise": 1,
                                "lexical_faithfulness": 1, "lexical_context_use": 1,
                                "context_precision_gold": 0},
               "by_kind": {"factual": {"examples": 1, "accuracy": 1.0,
                                       "retrieval_usage_rate": 1.0, "answer_quality": 0.6,
                                       "taas": 0.6, "faithfulness": 0.7,
                                       "hallucination_rate": 0.5, "context_precision": 0.25}},
               "retrieval_usage_rate": 1.0,
               "llm_judge_correctness": 4.0, "llm_judge_relevance": 5.0,
               "llm_judge_completeness": 3.0, "llm_judge_evidence_grounding": 4.0,
               "llm_judge_hallucination_risk": 2.0, "llm_judge_overall": 4.0,
               "llm_judge_invalid": 0}


@pytest.fixture()
def old_run(tmp_path: Path) -> Path:
    run = tmp_path / "old-run"
    (run / "results").mkdir(parents=True)
    (run / "config.yaml").write_text(OLD_CONFIG, encoding="utf-8")
    (run / "results" / "vanilla.jsonl").write_text(json.dumps(OLD_RECORD) + "\n",
                                                   encoding="utf-8")
    (run / "summary.json").write_text(json.dumps({
        "dataset": "data/nutrition.jsonl",
        "llm_judge": {"model": "grader-model", "self_graded": False},
        "pipelines": {"vanilla": OLD_SUMMARY}}), encoding="utf-8")
    return run


def test_old_config_reads_its_taas_weights_and_grader_under_the_new_keys(old_run: Path) -> None:
    weights = TAASWeights(quality=0.5, sentence_similarity=0.3, sentence_support=0.2)
    trust = TrustConfig(taas=weights, llm_grader=True,
                        grader_model=BackendSpec(model="grader-model"))
    # The same run as today's config of it: `eval` resumes the folder.
    assert load_run_config(old_run / "config.yaml") == RunConfig(
        dataset="data/nutrition.jsonl", pipelines=("vanilla",), trust=trust)


def test_old_records_read_under_the_new_names_and_summarise(old_run: Path) -> None:
    (record,) = JsonlLog(old_run / "results" / "vanilla.jsonl").read_records(EvalRecord)
    trust = record.trust
    assert trust is not None
    assert trust.faithfulness == 0.75  # the study's: the old lexical_faithfulness
    assert trust.hallucination_rate == pytest.approx(0.25)  # the study's: 1 − faithfulness
    assert trust.sentence_similarity == 0.7  # the old cosine "faithfulness"
    assert trust.unsupported_sentence_rate == 0.5  # the old "hallucination_rate"
    # The old sentence-cosine measures are sieverag's own. The study's context precision is
    # computed from the answer and the text read: of paris, capital, france the answer uses
    # two; its sentence support rate needs the encoder.
    assert trust.sentence_support_by_sentence == 0.5
    assert trust.sentence_context_precision == 0.25
    assert trust.sentence_evidence_noise == 0.5
    assert trust.context_precision == pytest.approx(2 / 3)
    assert trust.evidence_noise == pytest.approx(1 / 3)
    assert trust.sentence_support_rate is None
    # The old `taas` was the sentence score; TAAS is the study's, from the stored terms:
    # 0.4·AQS + 0.3·faithfulness + 0.3·(1 − hallucination rate).
    assert trust.sentence_taas == 0.6
    assert trust.taas == pytest.approx(0.4 * 0.6 + 0.6 * 0.75)
    assert trust.llm_grader == GraderGrades(**OLD_GRADES)
    assert {"lexical_faithfulness", "llm_judge"}.isdisjoint(record.to_json()["trust"])
    summary = summarize([record])
    assert (summary["faithfulness"], summary["hallucination_rate"]) == (0.75, 0.25)
    assert summary["sentence_similarity"] == 0.7
    assert summary["unsupported_sentence_rate"] == 0.5
    assert summary["sentence_context_precision"] == 0.25
    assert summary["context_precision"] == 0.6667
    assert summary["trust_counts"]["sentence_support_rate"] == 0
    # A line from before records kept the text read: nothing to compute from.
    older = EvalRecord.model_validate({**OLD_RECORD, "contexts": []})
    assert older.trust is not None and older.trust.context_precision is None
    assert older.trust.sentence_context_precision == 0.25
    assert (summary["grader_overall"], summary["grader_invalid"]) == (4.0, 0)


def test_a_record_written_between_the_renames_reads_its_grades_only_renamed() -> None:
    """Today's metric names, the old grader name: the metrics are left as they are."""
    between = {**{key: value for key, value in OLD_TRUST.items()
                  if key not in ("faithfulness", "hallucination_rate", "lexical_faithfulness")},
               "faithfulness": 0.75, "hallucination_rate": 0.25, "sentence_similarity": 0.7,
               "unsupported_sentence_rate": 0.5}
    trust = TrustMetrics.model_validate(between)
    assert (trust.faithfulness, trust.hallucination_rate) == (0.75, 0.25)
    assert trust.llm_grader == GraderGrades(**OLD_GRADES)


def test_an_old_summary_reports_and_collates_under_the_new_names(
        old_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, summaries = read_run_summary(old_run)
    summary = summaries["vanilla"]
    assert summary["faithfulness"] == 0.6667
    assert summary["hallucination_rate"] == 0.3333  # rounded as means are
    assert summary["sentence_similarity"] == 0.7 and summary["unsupported_sentence_rate"] == 0.5
    assert "lexical_faithfulness" not in summary
    # Its mean `taas` was the sentence score; the study's mean is not recomputed from means.
    assert (summary["sentence_taas"], summary["taas"]) == (0.6, None)
    assert summary["trust_counts"]["sentence_taas"] == 1 and summary["trust_counts"]["taas"] == 0
    assert summary["by_kind"]["factual"]["taas"] is None
    counts = summary["trust_counts"]
    assert counts["faithfulness"] == counts["hallucination_rate"] == 1
    assert counts["sentence_similarity"] == counts["unsupported_sentence_rate"] == 1
    # The old per-kind tables held no token faithfulness: unknown, not guessed.
    factual = summary["by_kind"]["factual"]
    assert (factual["faithfulness"], factual["hallucination_rate"]) == (None, None)
    assert (factual["sentence_similarity"], factual["unsupported_sentence_rate"]) == (0.7, 0.5)
    # Its context precision was the sentence-cosine one: now sieverag's own.
    assert (factual["context_precision"], factual["sentence_context_precision"]) == (None, 0.25)
    assert (summary["sentence_context_precision"], summary["sentence_evidence_noise"],
            summary["sentence_support_by_sentence"]) == (0.25, 0.5, 0.5)
    assert (summary["context_precision"], summary["evidence_noise"],
            summary["sentence_support_rate"]) == (None, None, None)
    assert counts["sentence_context_precision"] == 1 and counts["sentence_support_rate"] == 0
    table = comparison_table(summaries, TRUST_COLUMNS)
    assert ("| Faithfulness | Hallucination ↓ | Sentence TAAS (ours) | Sentence similarity "
            "(ours) | Sentence support by sentence (ours) | Sentence ctx precision (ours) | "
            "Sentence evidence noise ↓ (ours) |") in table
    assert "| vanilla | 1 | 1.000 | 0.600 | 0.667 | 0.333 | 0.600 | 0.700 | 0.500 | 0.250 | " \
           "0.500 |" in table
    assert summary["grader_hallucination_risk"] == 2.0 and summary["grader_invalid"] == 0
    assert not any(key.startswith("llm_judge") for key in summary)
    grades = comparison_table(summaries, GRADER_COLUMNS)
    assert "| correctness | relevance | completeness | evidence grounding |" in grades
    assert "| vanilla | 1 | 4.000 | 5.000 | 3.000 | 4.000 | 2.000 | 4.000 | 0 |" in grades
    records = JsonlLog(old_run / "results" / "vanilla.jsonl").read_records(EvalRecord)
    report = write_report(tmp_path / "report", "data/nutrition.jsonl", summaries,
                          {"vanilla": records}).read_text(encoding="utf-8")
    assert "LLM grader (1-5; ↓ lower is better)" in report and grades in report
    assert main(["report", "--runs", str(old_run)]) == 0
    assert "| vanilla | 1.000 |" in capsys.readouterr().out


def test_an_old_run_exports(old_run: Path, tmp_path: Path) -> None:
    assert export_run(old_run, tmp_path / "export.jsonl") == {"vanilla": 1}
