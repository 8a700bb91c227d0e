"""`label --concurrency N`: N questions' CXMI scored in one scorer call give the labels of one at
a time, written in dataset order; a rerun resumes; a failing question names itself.

Tolerance: CXMI of a question scored beside others differs from it scored alone only by float
rounding (other padding, other batch rows); on the tiny float32 model within 1e-4 nats.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_openai_server import FakeOpenAIServer, RecordedRequest, Reply, chat_reply

from sieverag.data_gen.cli import LabelCommand
from sieverag.data_gen.cxmi import BatchedCXMI, CXMIQuestion, SharedPrefixCXMI
from sieverag.data_gen.labelling import (
    LABEL_CONCURRENCY_HELP,
    LABELS_FILE,
    LabelRunConfig,
    run_labelling,
)
from sieverag.data_gen.teacher import TeacherConfig
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.in_flight import QuestionFailedError
from sieverag.inference.core.settings import parse_settings
from sieverag.inference.llm.hf import HFBackend, HFBackendConfig

TOLERANCE = 1e-4

CITIES = ["Vienna", "Paris", "Lisbon", "Oslo", "Cairo", "Lima", "Quito"]


def question_row(number: int, long_chunk: bool = False) -> dict:
    """Question `q<number>`: its own wording (so its own prefix length), a gold chunk and one
    or two distractors."""
    city = CITIES[number % len(CITIES)]
    ctxs = [{"title": f"Person {number}", "is_gold": True,
             "text": f"She was born in {city}. She studied physics for {number + 2} years."},
            {"title": "River", "is_gold": False, "text": "The Danube is long. It is wide."}]
    if number % 2:
        ctxs.append({"title": "Hill", "is_gold": False, "text": "A hill " * (number + 1) + "."})
    if long_chunk:
        ctxs.append({"title": "Filler", "is_gold": False, "text": "filler words " * 200})
    return {"id": f"q{number}", "question": f"Where was person {number} born" + "?" * number,
            "answers": [city, city.upper()] if number % 3 == 0 else [city], "ctxs": ctxs}


def write_dataset(path: Path, count: int = 7, long_chunk_at: int | None = None) -> Path:
    rows = [question_row(i, long_chunk=i == long_chunk_at) for i in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def scorer_on(tiny_model_dir: Path, **config) -> SharedPrefixCXMI:
    return SharedPrefixCXMI(HFBackend(HFBackendConfig(model=str(tiny_model_dir), device="cpu",
                                                      **config)))


def read_records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / LABELS_FILE).read_text().splitlines()]


def label(dataset: Path, out: Path, tiny_model_dir: Path, concurrency: int, **config):
    return run_labelling(
        LabelRunConfig(dataset=str(dataset), out=str(out), scorer=str(tiny_model_dir),
                       device="cpu", concurrency=concurrency, **config),
        progress=False, scorer_factory=lambda _: scorer_on(tiny_model_dir))


def assert_same_labels(mine: list[dict], reference: list[dict]) -> None:
    """Equal records, CXMI floats within TOLERANCE."""
    assert [r["question_id"] for r in mine] == [r["question_id"] for r in reference]
    for got, want in zip(mine, reference, strict=True):
        assert got["no_context_logprobs"].keys() == want["no_context_logprobs"].keys()
        for alias, value in want["no_context_logprobs"].items():
            assert got["no_context_logprobs"][alias] == pytest.approx(value, abs=TOLERANCE)
        for got_chunk, want_chunk in zip(got["chunks"], want["chunks"], strict=True):
            scored = [(got_chunk["cxmi"], want_chunk["cxmi"]), *zip(
                got_chunk["sentence_cxmi"], want_chunk["sentence_cxmi"], strict=True)]
            for got_score, want_score in scored:
                assert got_score["alias"] == want_score["alias"]
                for key in ("score", "logprob_with", "logprob_without"):
                    assert got_score[key] == pytest.approx(want_score[key], abs=TOLERANCE)
            rest = {k for k in want_chunk if k not in ("cxmi", "sentence_cxmi")}
            assert {k: got_chunk[k] for k in rest} == {k: want_chunk[k] for k in rest}


def test_many_questions_scored_together_score_as_each_alone(tiny_model_dir: Path) -> None:
    rows = [question_row(i) for i in range(5)]
    questions = [CXMIQuestion(r["question"], r["answers"],
                              [c["text"] for c in r["ctxs"]] + ["She was born there."])
                 for r in rows]
    scorer = scorer_on(tiny_model_dir, batch_size=6)
    passes = []
    score_batch = scorer._score_batch
    scorer._score_batch = lambda *args: passes.append(len(args[0])) or score_batch(*args)
    alone = [scorer.score(q.question, q.answers, q.contexts) for q in questions]
    passes_alone = len(passes)
    passes.clear()
    together = scorer.score_many(questions)
    # the questions' rows fill shared batches: fewer forward passes for the same rows
    assert len(passes) < passes_alone and max(passes) == 6
    served = BatchedCXMI(scorer.backend).score_many(questions)
    for mine, batched, reference in zip(together, served, alone, strict=True):
        assert len(mine) == len(reference)
        for m, b, r in zip(mine, batched, reference, strict=True):
            assert m.alias == b.alias == r.alias
            assert m.score == pytest.approx(r.score, abs=TOLERANCE)
            assert m.logprob_with == pytest.approx(r.logprob_with, abs=TOLERANCE)
            assert m.logprob_without == pytest.approx(r.logprob_without, abs=TOLERANCE)
            assert b.score == pytest.approx(r.score, abs=TOLERANCE)


def test_concurrency_gives_the_same_labels_in_dataset_order(tmp_path: Path,
                                                           tiny_model_dir: Path) -> None:
    dataset = write_dataset(tmp_path / "data.jsonl")
    one = label(dataset, tmp_path / "n1", tiny_model_dir, 1)
    four = label(dataset, tmp_path / "n4", tiny_model_dir, 4, questions_per_step=2)
    reference, merged = read_records(tmp_path / "n1"), read_records(tmp_path / "n4")
    assert [r["question_id"] for r in merged] == [f"q{i}" for i in range(7)]
    assert_same_labels(merged, reference)
    # the same work, counted the same: one sequence per context and alias, plus the no-context
    assert four.scorer_usage == one.scorer_usage
    assert four.questions_labelled == 7 and four.chunks_labelled == one.chunks_labelled


def born_in_vienna_is_relevant(request: RecordedRequest) -> Reply:
    relevant = "born in Vienna" in request.json["messages"][1]["content"]
    return Reply(body=chat_reply(json.dumps({"relevant": relevant,
                                             "key_sentences": [1] if relevant else []})))


def test_each_question_gets_its_own_teacher_verdicts_when_a_step_holds_several_groups(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    dataset = write_dataset(tmp_path / "data.jsonl")
    out = tmp_path / "labels"
    with FakeOpenAIServer(born_in_vienna_is_relevant) as server:
        # steps of 6 and 1 questions, scored 2 at a time
        label(dataset, out, tiny_model_dir, 2, questions_per_step=6,
              teacher=TeacherConfig(endpoint=server.base_url, model="t"))
    records = read_records(out)
    assert [r["question_id"] for r in records] == [f"q{i}" for i in range(7)]
    for record in records:
        assert [c["teacher"]["relevant"] for c in record["chunks"]] \
            == [c["gold"] and "Vienna" in record["answers"] for c in record["chunks"]]


def test_a_rerun_at_another_concurrency_resumes_after_the_written_questions(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    dataset = write_dataset(tmp_path / "data.jsonl")
    out = tmp_path / "labels"
    label(dataset, out, tiny_model_dir, 4, limit=3)
    first = (out / LABELS_FILE).read_text()
    again = label(dataset, out, tiny_model_dir, 16)
    assert (again.questions_done_before, again.questions_labelled) == (3, 4)
    assert (out / LABELS_FILE).read_text().startswith(first)
    assert [r["question_id"] for r in read_records(out)] == [f"q{i}" for i in range(7)]
    label(dataset, tmp_path / "reference", tiny_model_dir, 1)
    assert_same_labels(read_records(out), read_records(tmp_path / "reference"))


def test_a_failing_question_names_itself_and_the_questions_before_it_are_kept(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    # q5 has a chunk over the scorer's context, which refuses it (context_overflow: error)
    dataset = write_dataset(tmp_path / "data.jsonl", long_chunk_at=5)
    out = tmp_path / "labels"
    config = LabelRunConfig(dataset=str(dataset), out=str(out), scorer=str(tiny_model_dir),
                            concurrency=4)

    def refusing_scorer(_: LabelRunConfig) -> SharedPrefixCXMI:
        return scorer_on(tiny_model_dir, context_length=256, context_overflow="error")

    with pytest.raises(QuestionFailedError, match=r"question 'q5' failed: .*context") as failed:
        run_labelling(config, progress=False, scorer_factory=refusing_scorer)
    assert "the other 5 question(s)" in str(failed.value) and "rerun" in str(failed.value)
    # the first group of four, and q4 of the second (scored before q5)
    assert [r["question_id"] for r in read_records(out)] == [f"q{i}" for i in range(5)]
    with pytest.raises(QuestionFailedError, match=r"question 'q5'.*the other 0 question"):
        run_labelling(config, progress=False, scorer_factory=refusing_scorer)
    assert len(read_records(out)) == 5


def test_the_progress_bar_shows_the_questions_in_flight(
        tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset = write_dataset(tmp_path / "data.jsonl", count=5)
    run_labelling(LabelRunConfig(dataset=str(dataset), out=str(tmp_path / "labels"),
                                 scorer=str(tiny_model_dir), concurrency=3),
                  scorer_factory=lambda _: scorer_on(tiny_model_dir))
    shown = capsys.readouterr().err
    assert "in flight 3" in shown and "in flight 2" in shown and "5/5" in shown


def test_label_command_takes_concurrency_and_refuses_zero() -> None:
    command = parse_settings(LabelCommand, ["--dataset", "d", "--out", "o", "--concurrency",
                                            "4"], "sieverag label")
    assert command.concurrency == 4
    assert parse_settings(LabelCommand, ["--dataset", "d", "--out", "o"],
                          "sieverag label").concurrency == 1
    assert LabelRunConfig.__dataclass_fields__["concurrency"].metadata["help"] \
        == LABEL_CONCURRENCY_HELP
    with pytest.raises(ConfigError, match="concurrency must be >= 1"):
        parse_settings(LabelCommand, ["--dataset", "d", "--out", "o", "--concurrency", "0"],
                       "sieverag label")
