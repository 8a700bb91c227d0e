"""The end of `sieverag train` (`training.evaluation.card_fit.fit_trained_filter`): MCF's
combination fitted on the run's own validation split, read from the datasets the build-dataset
folder was labelled from, each source left out in turn where there are two; one validation question:
the filter's score Platt-scaled alone; nothing to fit on: one line saying why, and the card
ranks by the filter alone. A scripted filter stands in for the trained adapter (no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_backend import ScriptedBackend

from sieverag.inference.filters.card.card_file import CARD_FILE, read_card
from sieverag.inference.filters.card.combination import (
    FILTER_ALONE,
    FILTER_ALONE_FIT,
    card_combination,
)
from sieverag.inference.filters.filter_format import chunk_record
from sieverag.training.evaluation.card_fit import fit_trained_filter

SOURCES = ("nq", "popqa")


def questions(count: int) -> list[dict]:
    """Common-format questions, alternating between two sources, each with a gold passage
    and two others that often share more of the question's words (retrieval errs)."""
    return [{"id": f"q{k}", "source": SOURCES[k % 2], "question": f"who wrote book {k}?",
             "answers": [f"author {k}"],
             "ctxs": [{"title": "", "text": f"Author {k} penned it long ago." if k % 3
                       else f"It was penned in {1900 + k} by a clerk.", "is_gold": True},
                      {"title": "", "text": f"Nobody knows who wrote book {k}; the author of "
                       f"book {k} is unknown.", "is_gold": False},
                      {"title": "", "text": f"Book {k} is long; book {k} is old." if k % 2
                       else f"Shelves hold {k} volumes.", "is_gold": False}]}
            for k in range(count)]


def build_folder(folder: Path, rows: list[dict], validation: list[str], *,
                 labelled: list | None = None) -> Path:
    """A build-dataset folder whose validation split holds the questions `validation` and
    whose stats.json names the dataset file it was labelled from (`labelled`: as given)."""
    from datasets import Dataset, DatasetDict

    dataset = folder / "questions.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    def records(ids: list[str]) -> list[dict]:
        return [chunk_record(question=r["question"], chunk_text=r["ctxs"][0]["text"],
                             relevant=True, source=r["source"], question_id=r["id"])
                for r in rows if r["id"] in ids]

    data = folder / "data"
    training = [r["id"] for r in rows if r["id"] not in validation]
    DatasetDict({"train": Dataset.from_list(records(training)),
                 "validation": Dataset.from_list(records(validation))}
                ).save_to_disk(data / "dataset")
    stats = {"labelled": [{"labels": str(folder / "labels"), "dataset": str(dataset)}]
             if labelled is None else labelled}
    (data / "stats.json").write_text(json.dumps(stats), encoding="utf-8")
    return data


@pytest.fixture
def trained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A training run's output folder: its card (no combination), and the scripted filter
    built for it, which finds the gold passages relevant."""
    from sieverag.inference.llm import backend_registry

    folder = tmp_path / "run"
    folder.mkdir()
    card = {"name": "filter-test", "base_model": "scripted",
            "dataset": {"train_questions": [["nq", "q0"], ["popqa", "q1"]]}}
    (folder / CARD_FILE).write_text(json.dumps(card), encoding="utf-8")
    model = ScriptedBackend(labels=lambda text: {"Yes": 2.0 if "penned" in text else -1.0,
                                                 "No": 0.0})
    monkeypatch.setattr(backend_registry, "build_backend", lambda spec: model)
    return folder


def test_train_fits_the_combination_on_its_validation_split(trained: Path,
                                                            tmp_path: Path) -> None:
    rows = questions(8)
    validation = [f"q{k}" for k in range(2, 8)]
    said = fit_trained_filter(trained, build_folder(tmp_path, rows, validation),
                              progress=False)
    section = read_card(trained)["combination"]
    assert section["questions"] == sorted([r["source"], r["id"]] for r in rows
                                          if r["id"] in validation)
    assert section["datasets"] == ["questions.jsonl"]
    # Two sources in the split: each left out in turn.
    assert set(section["fit"]["leave_one_source_out"]) == set(SOURCES)
    combination = card_combination(read_card(trained))
    assert combination.fitted and combination.reads_filter()
    assert "6 validation question(s)" in said and "each source left out in turn" in said
    assert said.splitlines()[-1].startswith("MCF ranks by the filter's score combined with")


def test_one_validation_question_platt_scales_the_filters_score_alone(
        trained: Path, tmp_path: Path) -> None:
    rows = questions(3)
    said = fit_trained_filter(trained, build_folder(tmp_path, rows, ["q2"]), progress=False)
    combination = card_combination(read_card(trained))
    assert combination.fitted and 0 < combination.bar < 1
    assert {f for f, w in combination.weights.items() if w} == {"filter_log_odds"}
    assert combination.weights["filter_log_odds"] > 0
    assert "at least 2 questions" in combination.report["fit"][FILTER_ALONE_FIT]
    assert "MCF ranks by the filter's own score, Platt-calibrated on 1 question(s)" in said


@pytest.mark.parametrize(("labelled", "why"), [
    ([], "names no labelled datasets"),
    ([{"labels": "/gone/labels", "dataset": "/gone/questions.jsonl"}], "/gone/questions.jsonl"),
], ids=["folder records no datasets", "dataset file gone"])
def test_nothing_to_fit_on_is_said_and_the_card_ranks_by_the_filter_alone(
        trained: Path, tmp_path: Path, labelled: list, why: str) -> None:
    data = build_folder(tmp_path, questions(4), ["q2", "q3"], labelled=labelled)
    said = fit_trained_filter(trained, data, progress=False)
    assert "combination" not in read_card(trained)
    assert card_combination(read_card(trained)) == FILTER_ALONE
    reason, statement = said.splitlines()
    assert reason.startswith(f"no combination fitted on the validation split of {data}: ")
    assert why in reason and f"sieverag filter fit-combination {trained}" in reason
    assert statement.startswith("MCF ranks by the filter's own score, its P(Yes)")
