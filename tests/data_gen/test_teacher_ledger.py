"""The teacher's ledger (`usage.jsonl`), its budget and its pacing, against the fake OpenAI
server: the ledger sums every run of a folder and equals what the server served; a run stops
before a request that could pass `--teacher.max-cost` and resumes with more; no reply is paid
for twice, not even the first half of a corrected request."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fake_openai_server import FakeOpenAIServer, RecordedRequest, Reply, chat_reply

from sieverag.data_gen.cli import LabelCommand
from sieverag.data_gen.labelling import LabelRunConfig, run_labelling
from sieverag.data_gen.ledger import USAGE_FILE, BudgetExhaustedError, Prices, UsageLedger
from sieverag.data_gen.teacher import TeacherClient, TeacherConfig, TeacherRequest
from sieverag.inference.core.errors import ConfigError, SieveragError
from sieverag.inference.core.settings import parse_settings
from sieverag.inference.llm.openai_backend import ReplyUsage

QUESTIONS, CHUNKS = 4, 2
VALID = '{"relevant": true, "key_sentences": [1]}'


def write_dataset(path: Path) -> Path:
    with path.open("w") as handle:
        for q in range(QUESTIONS):
            ctxs = [{"title": f"T{q}-{c}", "text": f"Fact {c} about topic {q}. More text."}
                    for c in range(CHUNKS)]
            handle.write(json.dumps({"id": f"q{q}", "question": f"What about topic {q}?",
                                     "answers": [f"topic {q}"], "ctxs": ctxs}) + "\n")
    return path


def verdict(request: RecordedRequest) -> Reply:
    # Token counts that differ per request, so a sum that double-counts cannot match.
    size = len(request.raw)
    return Reply(body=chat_reply(VALID, prompt_tokens=size // 4, completion_tokens=9))


def label(dataset: Path, out: Path, server: FakeOpenAIServer, *, progress: bool = False,
          **teacher: object):
    settings = {"endpoint": server.base_url, "model": "teacher-x", "backoff_s": 0.01,
                "timeout_s": 5.0, **teacher}
    return run_labelling(LabelRunConfig(dataset=str(dataset), out=str(out), scorer=None,
                                        questions_per_step=2, teacher=TeacherConfig(**settings)),
                         progress=progress)


def ledger_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / USAGE_FILE).read_text().splitlines()]


def test_the_ledger_sums_every_run_and_equals_what_the_server_served(tmp_path: Path) -> None:
    dataset, out = write_dataset(tmp_path / "data.jsonl"), tmp_path / "labels"
    with FakeOpenAIServer(verdict) as server:
        first = TeacherClient(TeacherConfig(endpoint=server.base_url, model="teacher-x"),
                              out / "teacher_cache.jsonl")
        first.label([TeacherRequest("What about topic 0?", ("Fact 0 about topic 0.",
                                                             "More text."), "T0-0")])
        first.close()
        # A run killed after caching a reply, before its ledger line: the line is lost...
        lines = (out / USAGE_FILE).read_text().splitlines()
        (out / USAGE_FILE).write_text("")
        # ...and another run's torn last line is tolerated.
        (out / USAGE_FILE).write_text('{"key": "torn", "prompt_tok')
        summary = label(dataset, out, server, price_in=2.0, price_out=8.0)
    assert len(lines) == 1
    ledger = summary.teacher["ledger"]
    served = server.tokens_served
    # The reply cached before the "kill" is in the ledger again, and nothing twice.
    assert ledger["replies"] == len(server.served) == QUESTIONS * CHUNKS
    assert (ledger["prompt_tokens"], ledger["completion_tokens"]) \
        == (served["prompt_tokens"], served["completion_tokens"])
    assert ledger["cost_usd"] == pytest.approx(
        (served["prompt_tokens"] * 2.0 + served["completion_tokens"] * 8.0) / 1e6, abs=1e-6)
    assert len({line["key"] for line in ledger_lines(out)}) == QUESTIONS * CHUNKS
    written = json.loads((out / "summary.json").read_text())
    assert written["teacher"]["ledger"] == ledger


def test_max_cost_stops_before_the_budget_and_a_higher_one_resumes(tmp_path: Path) -> None:
    dataset, out = write_dataset(tmp_path / "data.jsonl"), tmp_path / "labels"
    prices = {"price_in": 1000.0, "price_out": 1000.0}  # USD per million: 0.001 a token
    with FakeOpenAIServer(verdict) as server:
        with pytest.raises(BudgetExhaustedError,
                           match=r"--teacher.max-cost \$1 in this folder.*a higher") as stopped:
            label(dataset, out, server, max_cost=1.0, max_concurrency=1, **prices)
        assert "\n" not in str(stopped.value)
        spent = UsageLedger(out / USAGE_FILE, Prices(**prices)).totals
        assert 0 < spent.cost_usd <= 1.0 and spent.replies == len(server.requests)
        assert spent.replies < QUESTIONS * CHUNKS
        summary = label(dataset, out, server, max_cost=100.0, **prices)
        assert summary.questions_labelled + summary.questions_done_before == QUESTIONS
    # Every chunk asked once across the two runs: the stopped run sent nothing it lost.
    assert len(server.requests) == QUESTIONS * CHUNKS
    assert summary.teacher["ledger"]["replies"] == QUESTIONS * CHUNKS


def test_the_first_reply_of_a_corrected_request_is_not_paid_twice(tmp_path: Path) -> None:
    request = TeacherRequest("Who?", ("One.", "Two."))
    with FakeOpenAIServer(verdict) as server:
        server.script(Reply(body=chat_reply("not JSON", prompt_tokens=50)),
                      Reply(status=400, body={"error": {"message": "context too long"}}))
        teacher = TeacherClient(TeacherConfig(endpoint=server.base_url, model="teacher-x"),
                                tmp_path / "teacher_cache.jsonl")
        with pytest.raises(SieveragError, match="context too long"):
            teacher.label([request])  # the run dies between the reply and its correction
        teacher.close()
        again = TeacherClient(TeacherConfig(endpoint=server.base_url, model="teacher-x"),
                              tmp_path / "teacher_cache.jsonl")
        [result] = again.label([request])
        again.close()
    assert result.status == "valid" and result.attempts == 2
    # The first request went out once; only the correction was asked again.
    first = [r for r in server.requests if len(r.json["messages"]) == 2]
    assert len(first) == 1 and len(server.requests) == 3
    assert [line["prompt_tokens"] for line in ledger_lines(tmp_path)][0] == 50
    assert len(ledger_lines(tmp_path)) == 2


def test_the_progress_bar_shows_dollars_and_a_rate_limit_wait(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset, out = write_dataset(tmp_path / "data.jsonl"), tmp_path / "labels"
    with FakeOpenAIServer(verdict) as server:
        server.script(Reply(status=429, headers={"Retry-After": "2.5"}))
        label(dataset, out, server, progress=True, price_in=1.0, price_out=1.0)
    shown = capsys.readouterr().err
    assert re.search(r"rate limited: resuming in [123] s", shown)
    assert "so far, ~$" in shown


def test_teacher_pacing_and_price_flags_parse_and_bad_values_name_the_flag() -> None:
    command = parse_settings(LabelCommand, [
        "--dataset", "d", "--out", "o", "--teacher.endpoint", "http://127.0.0.1:9/v1",
        "--teacher.model", "m", "--teacher.rpm", "500", "--teacher.tpm", "200000",
        "--teacher.patience", "7200", "--teacher.token-field", "max_completion_tokens",
        "--teacher.price-in", "2.5", "--teacher.price-out", "10", "--teacher.max-cost", "40"],
        "sieverag label")
    teacher = command.teacher
    assert (teacher.rpm, teacher.tpm, teacher.patience, teacher.max_cost) == (500, 200000,
                                                                              7200.0, 40.0)
    backend = teacher.backend_config()
    assert (backend.rpm, backend.patience_s, backend.token_field, backend.max_retries) \
        == (500, 7200.0, "max_completion_tokens", None)
    assert Prices(2.5, 10.0).cost(ReplyUsage(1_000_000, 100_000, 0, 400_000)) \
        == pytest.approx(2.5 + 1.0)
    for flags, field in ((["--teacher.rpm", "0"], "teacher.rpm"),
                         (["--teacher.patience", "0"], "teacher.patience"),
                         (["--teacher.max-cost", "5"], "teacher.max_cost"),
                         (["--teacher.price-out", "-1"], "teacher.price_out")):
        with pytest.raises(ConfigError, match=field):
            parse_settings(LabelCommand, ["--dataset", "d", "--out", "o", "--teacher.endpoint",
                                          "http://127.0.0.1:9/v1", "--teacher.model", "m",
                                          *flags], "sieverag label")
