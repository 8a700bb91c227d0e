"""A run folder written before the trust metrics took the Auto-RAG study's names (cosine
`faithfulness`, `hallucination_rate` = 1 − sentence support, `lexical_faithfulness`, TAAS
weights `faithfulness`/`grounding`) still loads, summarises, reports, collates and exports,
under today's names (inference/eval/migration.py, docs/compatibility.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sieverag.cli import main
from sieverag.inference.config import RunConfig, TAASWeights, TrustConfig, load_run_config
from sieverag.inference.eval.export import export_run
from sieverag.inference.eval.records import EvalRecord
from sieverag.inference.eval.report import TRUST_COLUMNS, comparison_table, read_run_summary
from sieverag.inference.eval.summary import summarize
from sieverag.inference.io_utils import JsonlLog

OLD_CONFIG = """dataset: data/nutrition.jsonl
pipelines: [vanilla]
trust:
  taas: {quality: 0.5, faithfulness: 0.3, grounding: 0.2}
"""
OLD_TRUST = {"retrieved": True, "answer_quality": 0.6, "faithfulness": 0.7,
             "hallucination_rate": 0.5, "sentence_support_rate": 0.5,
             "context_precision": 0.25, "evidence_noise": 0.5, "taas": 0.6,
             "lexical_faithfulness": 0.75, "lexical_context_use": 1.0,
             "context_precision_gold": None}
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
               "retrieval_usage_rate": 1.0}


@pytest.fixture()
def old_run(tmp_path: Path) -> Path:
    run = tmp_path / "old-run"
    (run / "results").mkdir(parents=True)
    (run / "config.yaml").write_text(OLD_CONFIG, encoding="utf-8")
    (run / "results" / "vanilla.jsonl").write_text(json.dumps(OLD_RECORD) + "\n",
                                                   encoding="utf-8")
    (run / "summary.json").write_text(json.dumps({"dataset": "data/nutrition.jsonl",
                                                  "pipelines": {"vanilla": OLD_SUMMARY}}),
                                      encoding="utf-8")
    return run


def test_old_config_reads_its_taas_weights_under_the_new_keys(old_run: Path) -> None:
    weights = TAASWeights(quality=0.5, sentence_similarity=0.3, sentence_support=0.2)
    # The same run as today's config of it: `eval` resumes the folder.
    assert load_run_config(old_run / "config.yaml") == RunConfig(
        dataset="data/nutrition.jsonl", pipelines=("vanilla",), trust=TrustConfig(taas=weights))


def test_old_records_read_under_the_new_names_and_summarise(old_run: Path) -> None:
    (record,) = JsonlLog(old_run / "results" / "vanilla.jsonl").read_records(EvalRecord)
    trust = record.trust
    assert trust is not None
    assert trust.faithfulness == 0.75  # the study's: the old lexical_faithfulness
    assert trust.hallucination_rate == pytest.approx(0.25)  # the study's: 1 − faithfulness
    assert trust.sentence_similarity == 0.7  # the old cosine "faithfulness"
    assert trust.unsupported_sentence_rate == 0.5  # the old "hallucination_rate"
    assert (trust.sentence_support_rate, trust.taas) == (0.5, 0.6)  # unchanged
    assert "lexical_faithfulness" not in record.to_json()["trust"]
    summary = summarize([record])
    assert (summary["faithfulness"], summary["hallucination_rate"]) == (0.75, 0.25)
    assert summary["sentence_similarity"] == 0.7
    assert summary["unsupported_sentence_rate"] == 0.5


def test_an_old_summary_reports_and_collates_under_the_new_names(
        old_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, summaries = read_run_summary(old_run)
    summary = summaries["vanilla"]
    assert summary["faithfulness"] == 0.6667
    assert summary["hallucination_rate"] == 0.3333  # rounded as means are
    assert summary["sentence_similarity"] == 0.7 and summary["unsupported_sentence_rate"] == 0.5
    assert "lexical_faithfulness" not in summary
    counts = summary["trust_counts"]
    assert counts["faithfulness"] == counts["hallucination_rate"] == 1
    assert counts["sentence_similarity"] == counts["unsupported_sentence_rate"] == 1
    # The old per-kind tables held no token faithfulness: unknown, not guessed.
    factual = summary["by_kind"]["factual"]
    assert (factual["faithfulness"], factual["hallucination_rate"]) == (None, None)
    assert (factual["sentence_similarity"], factual["unsupported_sentence_rate"]) == (0.7, 0.5)
    table = comparison_table(summaries, TRUST_COLUMNS)
    assert "| Faithfulness | Hallucination ↓ | Sentence similarity |" in table
    assert "| vanilla | 1 | 1.000 | 0.600 | 0.600 | 0.667 | 0.333 | 0.700 | 0.500 |" in table
    assert main(["report", "--runs", str(old_run)]) == 0
    assert "| vanilla | 1.000 |" in capsys.readouterr().out


def test_an_old_run_exports(old_run: Path, tmp_path: Path) -> None:
    assert export_run(old_run, tmp_path / "export.jsonl") == {"vanilla": 1}
