"""Questions in flight in `eval-filter` and `filter fit-combination` (`--concurrency`): the same
report, decisions, cache tables and fitted card at N = 1 and N = 4; one batcher per run whose
one worker runs every in-process call, merged across questions through the filter's
`CachingBackend`; served models run 16 questions at once by default; a failing question
raises one error naming it, keeps what finished, and a rerun asks only for the rest."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from fake_backend import ScriptedBackend, scripted_filter_folder
from repo_paths import REPO

from sieverag.inference.composition.config import ModelRoles
from sieverag.inference.core.errors import SieveragError
from sieverag.inference.core.in_flight import QuestionFailedError
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.inference.llm import call_batching
from sieverag.inference.llm.backend_protocol import GenerationSettings
from sieverag.inference.llm.backend_registry import BackendSpec
from sieverag.inference.llm.call_batching import CallBatcher
from sieverag.training.cli import filter as filter_cli
from sieverag.training.evaluation import combination_fit, filter_eval, questions_in_flight
from sieverag.training.evaluation import filter_methods as methods
from sieverag.training.evaluation.caching_backend import CachingBackend
from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig
from sieverag.training.evaluation.held_out_questions import TrainingQuestions, select_examples

ROOT = REPO
SAMPLE = ROOT / "tests" / "data" / "hotpotqa_sample.jsonl"
BOOKS = 8


class ThreadNotingBackend(ScriptedBackend):
    """A scripted model that notes which thread ran each of its calls; a question about
    book `failing_book` fails while that is set."""

    def __init__(self) -> None:
        super().__init__(reply=self.answer, labels=self.verdict)
        self.threads: set[str] = set()
        self.failing_book: int | None = None

    @staticmethod
    def answer(text: str) -> str:
        return "1, 2" if len(text) % 3 else "none"

    def verdict(self, text: str) -> dict[str, float]:
        if self.failing_book is not None and f"book {self.failing_book}?" in text:
            raise RuntimeError("the filter cannot read this passage")
        return {"Yes": (len(text) * 7919 % 101) / 25 - 2, "No": 0.0}

    def generate(self, prompts, settings=GenerationSettings(), *, agent="generator"):
        self.threads.add(threading.current_thread().name)
        return super().generate(prompts, settings, agent=agent)

    def label_logprobs(self, prompts, labels, *, agent="scorer"):
        self.threads.add(threading.current_thread().name)
        return super().label_logprobs(prompts, labels, agent=agent)


def books_dataset(folder: Path) -> Path:
    """Eight common-format questions, gold-marked, with a gold and two other passages."""
    rows = [{"id": f"n{k}", "source": "nq", "question": f"who wrote book {k}?",
             "answers": [f"author {k}"],
             "ctxs": [{"title": f"Book {k}", "text": f"Book {k} was written by author {k}.",
                       "is_gold": True},
                      {"title": "Other", "text": f"Book {k + 1} is long." * (k % 3 + 1),
                       "is_gold": False},
                      {"title": "Else", "text": f"Books are read, {k} by {k}.",
                       "is_gold": False}]}
            for k in range(BOOKS)]
    path = folder / "books.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def model(monkeypatch) -> ThreadNotingBackend:
    """Every model eval-filter builds (filter and judge) is this scripted one; its adapter is
    taken as given."""
    backend = ThreadNotingBackend()
    monkeypatch.setattr(filter_eval, "build_backend", lambda spec: backend)
    monkeypatch.setattr(filter_eval, "resolve_filter_role", lambda spec: spec)
    monkeypatch.setattr(filter_eval, "_filter_identity", lambda spec: {"scripted": True})
    return backend


@pytest.fixture
def batchers(monkeypatch) -> list[CallBatcher]:
    """Every CallBatcher a run opens."""
    opened: list[CallBatcher] = []

    class Noted(CallBatcher):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(call_batching, "CallBatcher", Noted)
    return opened


IN_PROCESS = ModelRoles(generator=BackendSpec(model="scripted-judge"),
                        filter=BackendSpec(model="scripted-filter"))
SERVED = ModelRoles(generator=BackendSpec(model="scripted-judge"),
                    filter=BackendSpec(model="scripted-filter", endpoint="http://127.0.0.1:9/v1"),
                    filter_card="retrieval-only")  # no server to show one: asked by name


def evaluate(out: Path, books: Path, concurrency: int | None, models: ModelRoles = IN_PROCESS,
             **settings) -> dict:
    config = FilterEvalConfig(
        dataset=(str(SAMPLE), str(books)), out=str(out), models=models,
        allow_training_questions=True, **settings)
    return filter_eval.run_filter_eval(config, progress=False, concurrency=concurrency)


def outputs(out: Path) -> dict[str, str]:
    """Every file a run writes but the plot, its own folder's name taken out."""
    return {str(p.relative_to(out)): p.read_text(encoding="utf-8").replace(str(out), "OUT")
            for p in sorted(out.rglob("*")) if p.is_file() and p.suffix != ".png"}


def without_out(report: dict) -> dict:
    return {**report, "config": {**report["config"], "out": None}}


def test_eval_filter_gives_the_same_report_at_one_and_four_in_flight(tmp_path, model,
                                                                      batchers):
    books = books_dataset(tmp_path)
    one = evaluate(tmp_path / "one", books, 1)
    assert not batchers  # one question at a time: no batcher
    asked_alone = sorted(model.calls)
    model.calls.clear()
    model.threads.clear()
    four = evaluate(tmp_path / "four", books, 4)
    assert without_out(four) == without_out(one)
    assert outputs(tmp_path / "four") == outputs(tmp_path / "one")  # report, decisions, cache
    lines = (tmp_path / "four" / "decisions.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["id"] for line in lines][-BOOKS:] == [f"n{k}" for k in range(BOOKS)]
    # One batcher for the run, closed at its end; its one worker ran every model call (the
    # filter's through its CachingBackend, the judge's), merging questions' calls, and each
    # request reached the model once, as one question at a time asks it.
    assert len(batchers) == 1 and not batchers[0]._thread.is_alive()
    assert model.threads == {"sieverag-batcher"}
    assert max(batchers[0].merged_sizes) > 1
    assert sorted(model.calls) == asked_alone
    chunk_asks = [text for agent, text in model.calls if agent == "filter_chunk"]
    assert len(chunk_asks) == len(set(chunk_asks)) == 6 + 3 * BOOKS


def test_a_served_filter_runs_sixteen_questions_at_once_by_default(tmp_path, model, batchers,
                                                                   monkeypatch):
    books = books_dataset(tmp_path)
    one = evaluate(tmp_path / "one", books, 1, SERVED, judge=False)
    seen: list[int] = []
    run_in_flight = questions_in_flight.run_in_flight

    def noted(*args, concurrency: int, **kwargs) -> None:
        seen.append(concurrency)
        run_in_flight(*args, concurrency=concurrency, **kwargs)

    monkeypatch.setattr(questions_in_flight, "run_in_flight", noted)
    served = evaluate(tmp_path / "served", books, None, SERVED, judge=False)
    assert seen and set(seen) == {16}
    assert not batchers  # the server batches: no in-process batcher
    assert without_out(served) == without_out(one)
    assert outputs(tmp_path / "served") == outputs(tmp_path / "one")


def test_a_failing_question_is_named_what_finished_is_kept_and_a_rerun_asks_the_rest(
        tmp_path, model):
    books = books_dataset(tmp_path)
    last = BOOKS - 1
    model.failing_book = last
    with pytest.raises(QuestionFailedError, match=f"question 'n{last}' failed: RuntimeError: "
                                                  "the filter cannot read this passage"):
        evaluate(tmp_path / "run", books, 4)
    model.failing_book = None
    model.calls.clear()
    report = evaluate(tmp_path / "run", books, 4)
    # The other questions' passages were scored and saved before the error: the rerun asks
    # the filter for the failed question's three passages only.
    chunk_asks = [text for agent, text in model.calls if agent == "filter_chunk"]
    assert len(chunk_asks) == 3 and all(f"book {last}?" in text for text in chunk_asks)
    assert report["datasets"]["books.jsonl"]["questions"]["evaluated"] == BOOKS
    assert without_out(report) == without_out(evaluate(tmp_path / "again", books, 1))


def test_the_sentence_rows_are_the_same_at_one_and_four_in_flight():
    """`mcf_sentence_results` through a batched CachingBackend: each question's results as
    one at a time gives them, by id in dataset order."""
    examples = select_examples(
        FilterEvalConfig(dataset=(str(SAMPLE),), out="unused"),
        TrainingQuestions(frozenset(), ())).examples
    configs = [MCFConfig(bar="top_k", top_k=1), MCFConfig(bar="fixed", threshold=0.0)]
    alone = methods.mcf_sentence_results(CachingBackend(ThreadNotingBackend()), examples,
                                         configs, progress=False)
    with CallBatcher() as batcher:
        merged = methods.mcf_sentence_results(batcher.wrap(CachingBackend(ThreadNotingBackend())),
                                              examples, configs, progress=False, concurrency=4)
    assert merged == alone
    assert [list(results) for results in merged[0]] == [[e.id for e in examples]] * len(configs)


# ----- filter fit-combination -----


def fit(tmp_path: Path, books: Path, concurrency: int | None, monkeypatch,
        model: ThreadNotingBackend) -> dict:
    """`filter fit-combination` on a scripted filter whose card lists no question of `books`
    as a training question; the card it writes."""
    from sieverag.inference.filters.card import card_file

    folder = tmp_path / f"filter-{concurrency}"
    scripted_filter_folder(monkeypatch, folder, [["nq", "elsewhere"]], model)
    command = filter_cli.FitCombinationCommand(
        adapter="scripted", dataset=(str(books),), folds=2, quiet=True,
        concurrency=concurrency)
    assert filter_cli.run_fit_combination(command) == 0
    return json.loads((folder / card_file.CARD_FILE).read_text(encoding="utf-8"))


def test_fit_combination_fits_the_same_card_at_one_and_four_in_flight(tmp_path, monkeypatch,
                                                                       batchers):
    books = books_dataset(tmp_path)
    model = ThreadNotingBackend()
    one = fit(tmp_path, books, None, monkeypatch, model)  # in-process: one at a time
    assert not batchers
    model.threads.clear()
    four = fit(tmp_path, books, 4, monkeypatch, model)
    assert four == one
    assert one["combination"]["questions"] == [["nq", f"n{k}"] for k in range(BOOKS)]
    assert len(batchers) == 1 and not batchers[0]._thread.is_alive()
    assert model.threads == {"sieverag-batcher"} and max(batchers[0].merged_sizes) > 1


def test_scored_rounds_come_in_dataset_order_and_a_failing_question_is_named(tmp_path):
    from sieverag.inference.data import load_examples

    examples = load_examples(books_dataset(tmp_path))
    model = ThreadNotingBackend()
    alone = combination_fit.score_rounds(model, examples, "all-minilm-l6-v2", progress=False)
    with CallBatcher() as batcher:
        merged = combination_fit.score_rounds(batcher.wrap(model), examples,
                                              "all-minilm-l6-v2", progress=False,
                                              concurrency=4)
    assert merged == alone
    assert [r.question_id for r in merged] == [f"n{k}" for k in range(BOOKS)]
    model.failing_book = 3
    with pytest.raises(QuestionFailedError, match="question 'n3' failed"):
        combination_fit.score_rounds(model, examples, "all-minilm-l6-v2", progress=False,
                                     concurrency=4)


def test_a_bad_concurrency_fails_before_any_work(tmp_path, model):
    with pytest.raises(SieveragError, match="--concurrency must be >= 1, got 0"):
        filter_cli.FitCombinationCommand(adapter="x", dataset=("d.jsonl",),
                                               concurrency=0)
    with pytest.raises(SieveragError, match="--concurrency must be >= 1, got 0"):
        evaluate(tmp_path / "out", books_dataset(tmp_path), 0)
    assert not model.calls


# ----- the tiny model: real batched forward passes -----


def test_the_tiny_filter_scores_the_same_merged_and_asks_each_passage_once(tiny_model_dir):
    """MCF rows on the tiny random model through one CachingBackend, batched across four
    questions: the scores one at a time gives (float rounding aside), each passage asked
    once for all the rows."""
    from sieverag.inference.data import load_examples
    from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

    hf = HFBackend(HFBackendConfig(model=str(tiny_model_dir), device="cpu", batch_size=16))
    examples = load_examples(SAMPLE)
    configs = [MCFConfig(bar="top_k", top_k=2, lexical_weight=0.0),
               MCFConfig(bar="adaptive", bar_n=0.0, lexical_weight=0.0)]
    alone = [methods.mcf_results(CachingBackend(hf), examples, c, progress=False)
             for c in configs]
    cached = CachingBackend(hf)
    with CallBatcher() as batcher:
        shared = batcher.wrap(cached)
        merged = [methods.mcf_results(shared, examples, c, progress=False, concurrency=4)
                  for c in configs]
    assert len(cached.labels) == sum(len(e.documents) for e in examples)
    for by_id, want in zip(merged, alone, strict=True):
        assert list(by_id) == [e.id for e in examples]
        for example_id, result in by_id.items():
            assert [s.score for s in result.scored] == pytest.approx(
                [s.score for s in want[example_id].scored], abs=1e-4)
