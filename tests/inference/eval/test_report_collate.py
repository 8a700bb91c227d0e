"""`sieverag report`: the papers' tables (a row per pipeline, a column per dataset) collated
from the summary.json of several `eval` runs, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

from sieverag.cli import main
from sieverag.inference.eval.report import collate_runs, dataset_label


def _run(folder: Path, dataset: str, pipelines: dict[str, dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"dataset": dataset,
                                                     "pipelines": pipelines}))
    return folder


def _summary(accuracy: float, f1: float, examples: int = 100) -> dict:
    return {"examples": examples, "accuracy": accuracy, "f1": f1, "em": None}


def test_dataset_labels_are_short_names():
    assert dataset_label("hf:nq_open:validation") == "nq_open:validation"
    assert dataset_label("data/popqa.jsonl") == "popqa"
    assert dataset_label("../shared/data/nq-open-oracle.jsonl.gz") == "nq-open-oracle"
    assert dataset_label("exports/hotpot_saved:validation") == "hotpot_saved:validation"


def test_one_table_per_metric_with_a_column_per_dataset(tmp_path):
    hotpot = _run(tmp_path / "hotpot", "data/hotpotqa.jsonl", {
        "vanilla": _summary(0.25, 0.125), "main-rag": _summary(0.5, 0.375)})
    popqa = _run(tmp_path / "popqa", "hf:akariasai/PopQA:test", {
        "direct": _summary(0.1, 0.05), "vanilla": _summary(0.75, 0.625)})
    text = collate_runs([hotpot, popqa])
    accuracy = text.split("## Accuracy")[1].split("## ")[0]
    assert "| pipeline | hotpotqa | akariasai/PopQA:test |" in accuracy
    # Rows in first-seen order; a pipeline a run lacks shows a dash, not a zero.
    rows = [line for line in accuracy.splitlines()
            if line.startswith("| ") and "pipeline" not in line]
    assert rows == ["| vanilla | 0.250 | 0.750 |", "| main-rag | 0.500 | – |",
                    "| direct | – | 0.100 |"]
    assert "| main-rag | 0.375 | – |" in text.split("## F1")[1]
    assert "## EM" not in text  # no run has it
    # Each run's own full table follows under its dataset.
    assert "### hotpotqa" in text and "### akariasai/PopQA:test" in text


def test_two_runs_of_one_dataset_are_told_apart_by_folder(tmp_path):
    first = _run(tmp_path / "a", "data/nq.jsonl", {"vanilla": _summary(0.2, 0.1)})
    second = _run(tmp_path / "b", "other/nq.jsonl", {"vanilla": _summary(0.3, 0.2)})
    assert "| pipeline | nq | nq (b) |" in collate_runs([first, second])


def test_the_command_prints_and_writes_and_refuses_a_folder_that_is_no_run(tmp_path, capsys):
    run = _run(tmp_path / "run", "data/triviaqa.jsonl", {"vanilla": _summary(0.4, 0.3)})
    out = tmp_path / "tables.md"
    assert main(["report", "--runs", str(run), "--out", str(out)]) == 0
    assert "| vanilla | 0.400 |" in capsys.readouterr().out
    assert "| vanilla | 0.400 |" in out.read_text()
    (tmp_path / "empty").mkdir()
    assert main(["report", "--runs", f"{run},{tmp_path / 'empty'}"]) == 2
    assert "summary.json not found" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.json").write_text("{not json")
    assert main(["report", "--runs", str(tmp_path / "bad")]) == 2
    assert "summary.json: not valid JSON" in capsys.readouterr().err
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "summary.json").write_text("[1, 2]")
    assert main(["report", "--runs", str(tmp_path / "odd")]) == 2
    assert "not a run summary" in capsys.readouterr().err
