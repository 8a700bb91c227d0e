"""Issue 65: blank and odd passages never stop a command. Every command that reads a QA
dataset (`eval`, `eval-filter`, `label`, `filter fit-combination`, `hard-negatives`) runs on
a question padded with an empty, a white-space-only, a repeated and a 5,000-word passage,
completes, and prints one line (`odd_passages_line`) counting them and saying what it did
with them. Tiny model or scripted backends only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_backend import ScriptedBackend, scripted_filter_folder
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

from sieverag.cli import main
from sieverag.inference.core.types import Document, Example
from sieverag.inference.data import PassageHandling, load_examples, odd_passages_line

QUESTIONS = 6
LONG_TEXT = " ".join(["filler words"] * 2500)  # 5,000 words: past every window and context
ODD = [{"title": "", "text": "", "is_gold": False},
       {"title": "", "text": "  \n ", "is_gold": False},
       {"title": "Long", "text": LONG_TEXT, "is_gold": False}]


def odd_dataset(folder: Path) -> Path:
    """Common-format questions, gold-marked; the first one's passages padded with an empty,
    a blank and a long passage and a copy of its gold passage (marked not gold)."""
    rows = []
    for k in range(QUESTIONS):
        gold = {"title": f"Book {k}", "text": f"Book {k} was written by author {k}.",
                "is_gold": True}
        ctxs = [gold, {"title": "Shelf", "text": f"Shelf {k} holds {k + 1} books.",
                       "is_gold": False}]
        if k == 0:
            ctxs += [ODD[0], ODD[1], {**gold, "is_gold": False}, ODD[2]]
        rows.append({"id": f"n{k}", "question": f"who wrote book {k}?",
                     "answers": [f"author {k}"], "ctxs": ctxs})
    path = folder / "odd.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def summary_lines(printed: str) -> list[str]:
    return [line for line in printed.splitlines() if line.startswith("passages: ")]


def test_the_line_counts_each_kind_once_and_is_none_for_clean_passages() -> None:
    def example(*texts: str) -> Example:
        return Example(id="q", question="q?", answers=("a",), documents=tuple(
            Document(id=f"q/{i}", text=t, title="T") for i, t in enumerate(texts)))

    handling = PassageHandling(blank="skipped", duplicate="kept", long="cut", window="5 words",
                               fits=lambda text: len(text.split()) <= 5)
    assert odd_passages_line([example("a b", "c d")], handling) is None
    long = "one two three four five six"
    # A repeated long passage is one odd passage, counted under both kinds; two empty
    # passages are not duplicates of each other.
    assert odd_passages_line([example("", "", " ", long, long), example("x")], handling) == (
        "passages: 5 odd of 6, in 1 of 2 questions: 2 empty and 1 blank (white space only) "
        "skipped; 1 duplicate kept; 2 longer than 5 words cut")
    without_window = PassageHandling(blank="skipped", duplicate="kept")
    assert odd_passages_line([example(long, "")], without_window) == (
        "passages: 1 odd of 2, in 1 of 1 question: 1 empty skipped")
    with pytest.raises(ValueError, match="`long` and a `window`"):
        PassageHandling(blank="skipped", duplicate="kept", fits=lambda text: True)


def test_eval_completes_and_says_the_generator_cut_the_long_passage(
        tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["eval", "--pipelines", "vanilla", "--dataset", str(odd_dataset(tmp_path)),
                 "--limit", "1", "--models.generator.model", str(tiny_model_dir),
                 "--out", str(out), "--quiet", "--generation.max-new-tokens", "4",
                 "--no-trust.enabled"]) == 0
    printed = capsys.readouterr()
    assert summary_lines(printed.out + printed.err) == [
        "passages: 4 odd of 6, in 1 of 1 question: 1 empty and 1 blank (white space only) "
        "given to the pipelines as they are; 1 duplicate given again; 1 longer than the "
        "generator's context of 1024 tokens cut to fit it"]
    record = json.loads((out / "results" / "vanilla.jsonl").read_text().splitlines()[0])
    assert len(record["documents_read"]) == 6
    usage = record["usage"]["generator"]
    assert usage["truncated_prompts"] == 1 and usage["tokens_dropped"] > 0


def test_eval_with_the_trained_filter_says_it_skips_blanks_and_reads_windows(
        tmp_path: Path) -> None:
    from sieverag.inference.composition.compose import Roles, plan_run
    from sieverag.inference.composition.config import ModelRoles, RunConfig
    from sieverag.inference.eval.runner import passage_handling
    from sieverag.inference.llm.backend_registry import BackendSpec

    models = ModelRoles(generator=BackendSpec(model="scripted"), filter_card="retrieval-only",
                        filter=BackendSpec(model="scripted-filter",
                                           endpoint="http://127.0.0.1:9/v1"))
    plan = plan_run(RunConfig(dataset=str(odd_dataset(tmp_path)), pipelines=("amber-mcf",),
                              models=models))
    handling = passage_handling(plan, Roles(generator=ScriptedBackend(),
                                            filter=ScriptedBackend()))
    assert odd_passages_line(load_examples(plan.config.dataset), handling) == (
        "passages: 4 odd of 16, in 1 of 6 questions: 1 empty and 1 blank (white space only) "
        "given to the pipelines as they are, not read by the trained filter (P(relevant) 0); "
        "1 duplicate given again; 1 longer than the filter's window of 256 tokens read by the "
        "trained filter in windows")


@pytest.mark.filterwarnings("ignore:the in-process filter has no adapter")
def test_eval_filter_completes_and_says_the_filter_skipped_blanks_and_read_windows(
        tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    from sieverag.inference.composition.config import ModelRoles
    from sieverag.inference.llm.backend_registry import BackendSpec
    from sieverag.training.cli.eval_filter import EvalFilterCommand, run_eval_filter
    from sieverag.training.evaluation import filter_eval

    backend = ScriptedBackend(labels=lambda text: {"Yes": (len(text) % 7) - 3.0, "No": 0.0})
    monkeypatch.setattr(filter_eval, "build_backend", lambda spec: backend)
    monkeypatch.setattr(filter_eval, "resolve_filter_role", lambda spec: spec)
    monkeypatch.setattr(filter_eval, "_filter_identity", lambda spec: {"scripted": True})
    out = tmp_path / "report"
    command = EvalFilterCommand(
        dataset=(str(odd_dataset(tmp_path)),), out=str(out), judge=False, quiet=True,
        allow_training_questions=True, models=ModelRoles(
            generator=BackendSpec(model="scripted-judge"),
            filter=BackendSpec(model="scripted-filter")))
    assert run_eval_filter(command) == 0
    expected = ("passages: 4 odd of 16, in 1 of 6 questions: 1 empty and 1 blank (white space "
                "only) not read by the filter (P(relevant) 0); 1 duplicate scored again; 1 "
                "longer than the filter's window of 256 tokens read by the filter in windows, "
                "judged by its best")
    assert summary_lines(capsys.readouterr().out) == [expected]
    assert json.loads((out / "report.json").read_text())["odd_passages"] == expected
    asked = [text for agent, text in backend.calls if agent == "filter_chunk"]
    read_long = [text for text in asked if "filler words" in text]
    assert read_long and not any(LONG_TEXT in text for text in read_long)  # windows of it
    assert all(text.split("Text:", 1)[1].strip() for text in asked)  # no blank one asked


def test_fit_combination_completes_and_says_it_read_every_passage_whole(
        tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    from sieverag.training.cli.filter import FitCombinationCommand, run_fit_combination

    folder = tmp_path / "filter"
    backend = ScriptedBackend(labels=lambda text: {"Yes": 2.0 if "written" in text else -2.0,
                                                   "No": 0.0})
    scripted_filter_folder(monkeypatch, folder, [["common", "other"]], backend)
    assert run_fit_combination(FitCombinationCommand(
        adapter="scripted", dataset=(str(odd_dataset(tmp_path)),), folds=2, quiet=True,
        home_sources="none")) == 0
    assert summary_lines(capsys.readouterr().out) == [
        "passages: 4 odd of 16, in 1 of 6 questions: 1 empty and 1 blank (white space only) "
        "scored by the filter as sent (MCF gives them 0 unread); 1 duplicate scored again; 1 "
        "longer than the filter's window of 256 tokens (words and marks) read whole (MCF "
        "reads them in windows)"]
    assert sum(agent == "filter_chunk" for agent, _ in backend.calls) == 16


def test_label_completes_and_says_the_scorer_cut_the_long_chunk(
        tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "labels"
    assert main(["label", "--dataset", str(odd_dataset(tmp_path)), "--out", str(out),
                 "--limit", "1", "--scorer", str(tiny_model_dir), "--device", "cpu",
                 "--cxmi-level", "chunk", "--quiet"]) == 0
    expected = ("passages: 4 odd of 6, in 1 of 1 question: 1 empty and 1 blank (white space "
                "only) labelled as given; 1 duplicate labelled again; 1 longer than the "
                "scorer's context of 1024 tokens labelled, their CXMI prompts cut to fit it")
    assert summary_lines(capsys.readouterr().out) == [expected]
    assert json.loads((out / "summary.json").read_text())["odd_passages"] == expected
    (record,) = [json.loads(line) for line in (out / "labels.jsonl").read_text().splitlines()]
    assert [c["text"] for c in record["chunks"]][2:4] == ["", "  \n "]
    assert all(c["cxmi"] is not None for c in record["chunks"])


def test_hard_negatives_completes_and_never_mines_a_blank_passage(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Dense retrieval ranks every passage (BM25 leaves out those sharing no word), so more
    # negatives are asked than the other passages with text: a blank one would be taken.
    out = tmp_path / "mined.jsonl"
    assert main(["hard-negatives", "--dataset", str(odd_dataset(tmp_path)), "--out", str(out),
                 "--negatives", "12", "--retriever", "dense"]) == 0
    assert summary_lines(capsys.readouterr().out) == [
        "passages: 3 odd of 16, in 1 of 6 questions: 1 empty and 1 blank (white space only) "
        "kept in their question as given, never mined as negatives; 1 duplicate kept as "
        "given, one copy among the negatives' candidates"]
    examples = load_examples(out)
    assert [d.text for d in examples[0].documents[2:4]] == ["", "  \n "]  # kept as given
    negatives = [d for e in examples for d in e.documents[6 if e.id == "n0" else 2:]]
    assert len(negatives) == 10 + 11 * (QUESTIONS - 1)  # every other passage with text
    assert all(d.text.strip() for d in negatives)
