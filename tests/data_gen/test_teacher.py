"""The teacher client against a real local HTTP server: valid, invalid and failing replies."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fake_openai_server import FakeOpenAIServer, RecordedRequest, Reply, chat_reply

from sieverag.data_gen.teacher import (
    TeacherCache,
    TeacherClient,
    TeacherConfig,
    TeacherReplyError,
    TeacherRequest,
    cache_key,
    parse_teacher_reply,
    steps_in_flight,
)
from sieverag.inference.core.errors import BackendUnavailableError, SieveragError

REQUEST = TeacherRequest("Where was Lise Meitner born?",
                         ("Lise Meitner was born in Vienna.", "She studied physics."),
                         "Lise Meitner")
VALID = '{"relevant": true, "key_sentences": [1]}'
# Replies json cannot read for Python's limits (RecursionError, and ValueError past 4,300 digits).
DEEP_REPLY = '{"relevant": true, "key_sentences": ' + "[" * 100_000 + "]" * 100_000 + "}"
BIG_NUMBER_REPLY = '{"relevant": true, "key_sentences": [' + "7" * 5000 + "]}"


def verdict_reply(request: RecordedRequest) -> Reply:
    """A valid verdict naming the last numbered sentence of the passage."""
    first_user = next(m["content"] for m in request.json["messages"] if m["role"] == "user")
    last = max(int(n) for n in re.findall(r"^\[(\d+)\]", first_user, re.MULTILINE))
    return Reply(body=chat_reply(json.dumps({"relevant": True, "key_sentences": [last]}),
                                 prompt_tokens=100, completion_tokens=12))


def client(server: FakeOpenAIServer, tmp_path: Path, **options) -> TeacherClient:
    settings = {"max_retries": 3, "backoff_s": 0.01, "timeout_s": 5.0, **options}
    return TeacherClient(TeacherConfig(endpoint=server.base_url, model="teacher-x", **settings),
                         tmp_path / "cache.jsonl")


def test_parse_teacher_reply() -> None:
    assert parse_teacher_reply(VALID, 2) == (True, (0,))
    assert parse_teacher_reply('```json\n{"relevant": false, "key_sentences": []}\n```', 2) \
        == (False, ())
    assert parse_teacher_reply('{"relevant": true, "key_sentences": [2, 1, 2]}', 2) \
        == (True, (0, 1))
    for bad in ("yes", "[1]", '{"relevant": "yes", "key_sentences": []}',
                '{"relevant": true}', '{"relevant": true, "key_sentences": [3]}',
                '{"relevant": true, "key_sentences": [0]}',
                '{"relevant": true, "key_sentences": [true]}', '{"relevant": true',
                DEEP_REPLY, BIG_NUMBER_REPLY):
        with pytest.raises(TeacherReplyError):
            parse_teacher_reply(bad, 2)


def test_valid_reply_is_cached_and_never_asked_again(tmp_path: Path) -> None:
    with FakeOpenAIServer(verdict_reply) as server:
        teacher = client(server, tmp_path)
        [verdict] = teacher.label([REQUEST])
        assert (verdict.status, verdict.relevant, verdict.key_sentences) == ("valid", True, (1,))
        assert teacher.stats.usage.prompt_tokens == 100
        assert teacher.stats.usage.completion_tokens == 12
        teacher.close()
        again = client(server, tmp_path)  # a new run reads the cache from disk
        assert again.label([REQUEST]) == [verdict]
        assert again.stats.cached == 1 and again.stats.asked == 0
        assert len(server.requests) == 1
        again.close()
    sent = server.requests[0].json
    assert sent["model"] == "teacher-x"
    assert "[2] She studied physics." in sent["messages"][1]["content"]


def test_invalid_reply_is_corrected_once(tmp_path: Path) -> None:
    with FakeOpenAIServer(verdict_reply) as server:
        server.script(Reply(body=chat_reply("Sentence 1 is relevant.")))
        teacher = client(server, tmp_path)
        [verdict] = teacher.label([REQUEST])
        teacher.close()
    assert verdict.status == "valid" and verdict.attempts == 2
    correction = server.requests[1].json["messages"]
    assert [m["role"] for m in correction] == ["system", "user", "assistant", "user"]
    assert correction[2]["content"] == "Sentence 1 is relevant."
    assert "the reply: not valid JSON" in correction[3]["content"]


@pytest.mark.parametrize(("bad", "reason"), [
    ('{"relevant": true, "key_sentences": [7]}', "do not exist"),
    (DEEP_REPLY, "nested too deeply"), (BIG_NUMBER_REPLY, "holds a number longer than")],
    ids=["a sentence that does not exist", "nested 100,000 deep", "5,000-digit integer"])
def test_twice_invalid_reply_is_recorded_invalid_not_accepted(tmp_path: Path, bad: str,
                                                              reason: str) -> None:
    """Corrected once, then recorded invalid (also a reply past Python's limits); the run goes
    on, and the invalid verdict is final: a rerun reads it from the cache."""
    with FakeOpenAIServer() as server:
        server.script(Reply(body=chat_reply(bad)), Reply(body=chat_reply(bad)))
        teacher = client(server, tmp_path)
        [verdict] = teacher.label([REQUEST])
        teacher.close()
        assert (verdict.status, verdict.relevant, verdict.attempts) == ("invalid", None, 2)
        assert reason in verdict.error
        assert reason in server.requests[1].json["messages"][-1]["content"]
        assert teacher.stats.invalid == 1
        rerun = client(server, tmp_path)
        assert rerun.label([REQUEST])[0].status == "invalid"
        rerun.close()
        assert len(server.requests) == 2  # not asked again


@pytest.mark.parametrize("failure", [
    Reply(status=429, headers={"Retry-After": "0"}, body={"error": "slow down"}),
    Reply(status=500, body={"error": "boom"}),
    Reply(status=503, body="<html>unavailable</html>"),
    Reply(delay_s=1.5, body=chat_reply(VALID)),  # longer than timeout_s: a timeout
], ids=["429", "500", "503", "timeout"])
def test_transient_failures_are_retried_and_the_label_counted_once(tmp_path: Path,
                                                                   failure: Reply) -> None:
    with FakeOpenAIServer(verdict_reply) as server:
        server.script(failure)
        teacher = client(server, tmp_path, timeout_s=0.5)
        [verdict] = teacher.label([REQUEST])
        teacher.close()
    assert verdict.status == "valid" and verdict.attempts == 1
    assert len(server.requests) == 2
    # The retry is inside one call: one label, one call's usage, one reply and one verdict.
    stats = teacher.stats
    assert (stats.asked, stats.valid, stats.corrections) == (1, 1, 0)
    assert (stats.usage.calls, stats.usage.prompt_tokens) == (1, 100)
    lines = [json.loads(line) for line in (tmp_path / "cache.jsonl").read_text().splitlines()]
    assert sorted("verdict" if "verdict" in line else "reply" for line in lines) \
        == ["reply", "verdict"]


def test_a_reply_cut_short_is_retried_and_a_page_that_is_not_json_stops_the_run(
        tmp_path: Path) -> None:
    with FakeOpenAIServer(verdict_reply) as server:
        server.script(Reply(body="{broken json"))
        teacher = client(server, tmp_path)
        assert teacher.label([REQUEST])[0].status == "valid"
        assert len(server.requests) == 2
        server.script(Reply(body="<html>login</html>", headers={"Content-Type": "text/html"}))
        with pytest.raises(BackendUnavailableError, match="not valid JSON"):
            teacher.label([TeacherRequest("Who?", ("One.",))])
        teacher.close()
        assert len(server.requests) == 3
    assert len(TeacherCache(tmp_path / "cache.jsonl")) == 1


def test_exhausted_retries_stop_the_run_and_keep_finished_replies(tmp_path: Path) -> None:
    other = TeacherRequest("Who?", ("One.",))
    with FakeOpenAIServer(verdict_reply) as server:
        teacher = client(server, tmp_path)
        teacher.label([other])
        server.responder = lambda request: Reply(status=500, body={"error": "down"})
        with pytest.raises(BackendUnavailableError):
            teacher.label([REQUEST])
        teacher.close()
    cache = TeacherCache(tmp_path / "cache.jsonl")
    assert len(cache) == 1
    assert cache.get(cache_key("teacher-x", other.messages())) is not None


def test_client_errors_fail_at_once(tmp_path: Path) -> None:
    with FakeOpenAIServer() as server:
        server.script(Reply(status=404, body={"error": {"message": "no such model"}}))
        teacher = client(server, tmp_path)
        with pytest.raises(SieveragError, match="no such model"):
            teacher.label([REQUEST])
        teacher.close()
        assert len(server.requests) == 1


def test_concurrency_is_bounded(tmp_path: Path) -> None:
    def slow(request: RecordedRequest) -> Reply:
        return Reply(delay_s=0.1, body=verdict_reply(request).body)

    requests = [TeacherRequest(f"Question {i}?", ("A.", "B.")) for i in range(9)]
    with FakeOpenAIServer(slow) as server:
        teacher = client(server, tmp_path, max_concurrency=3)
        verdicts = teacher.label(requests)
        teacher.close()
    assert server.max_in_flight <= 3
    assert [v.key_sentences for v in verdicts] == [(1,)] * 9
    assert teacher.stats.asked == 9 and teacher.stats.usage.calls == 9


def test_enough_steps_are_out_that_a_hung_request_does_not_stall_the_pace():
    """The labelling run keeps out enough steps of requests that, while a step waits out a
    timeout and a backoff, the others hold the set pace's worth: 600 rpm x (10 s + 1 s) =
    110 requests, two steps of 64, besides the oldest and one more; without rpm, 2; at most
    16."""
    def config(**settings: object) -> TeacherConfig:
        return TeacherConfig(endpoint="http://127.0.0.1:9/v1", model="m", **settings)

    assert steps_in_flight(config(rpm=600, timeout_s=10, backoff_s=1), 64) == 4
    assert steps_in_flight(config(rpm=600, timeout_s=60, backoff_s=1), 160) == 6
    assert steps_in_flight(config(rpm=60, timeout_s=10, backoff_s=1), 64) == 3
    assert steps_in_flight(config(), 64) == 2  # no rpm: the server's pace, unknown
    assert steps_in_flight(config(rpm=100_000, timeout_s=60), 8) == 16
