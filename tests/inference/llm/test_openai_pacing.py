"""The `openai` backend against a server that limits it: pacing (rpm, tpm, the server's
rate-limit headers), retries for as long as the patience lasts, and servers that want
`max_completion_tokens` and refuse `temperature` (the fake server's fault schedule)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from fake_openai_faults import FaultSchedule
from fake_openai_server import FakeOpenAIServer, RecordedRequest, Reply, chat_reply

from sieverag.inference.core.errors import BackendUnavailableError, SieveragError
from sieverag.inference.core.types import Conversation
from sieverag.inference.llm.backend_protocol import GenerationSettings
from sieverag.inference.llm.openai_backend import OpenAIBackend, OpenAIBackendConfig, ReplyUsage
from sieverag.inference.llm.rate_limit import RateLimiter, parse_duration, retry_after_s


def ask(text: str) -> Conversation:
    return [{"role": "user", "content": text}]


class FakeClock:
    """Time that passes only when the limiter sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def send_times(limiter: RateLimiter, clock: FakeClock, count: int, tokens: int = 1) -> list[float]:
    """When each of `count` requests got through the limiter (all asking at once)."""
    times: list[float] = []

    async def one() -> None:
        await limiter.acquire(tokens)
        times.append(clock.now)

    async def run() -> None:
        await asyncio.gather(*(one() for _ in range(count)))

    asyncio.run(run())
    return times


@pytest.fixture
def backends() -> Iterator[list[OpenAIBackend]]:
    made: list[OpenAIBackend] = []
    yield made
    for backend in made:
        backend.close()


def backend_on(server: FakeOpenAIServer, made: list[OpenAIBackend],
               **overrides: Any) -> OpenAIBackend:
    settings: dict[str, Any] = {"base_url": server.base_url, "model": "fake-model",
                                "backoff_s": 0.01, "timeout_s": 5.0, **overrides}
    backend = OpenAIBackend(OpenAIBackendConfig(**settings))
    made.append(backend)
    return backend


def test_the_limiter_holds_the_requests_a_minute() -> None:
    clock = FakeClock()
    times = send_times(RateLimiter(rpm=600, clock=clock, sleep=clock.sleep), clock, 70)
    # A second's worth (10) at once, then one every 0.1 s: 60 more in the next 6 s.
    assert times[:10] == [0.0] * 10
    assert times[-1] == pytest.approx(6.0)
    assert all(later - earlier <= 0.1 + 1e-9 for earlier, later in itertools.pairwise(times))
    within_a_minute = RateLimiter(rpm=600, clock=(clock := FakeClock()), sleep=clock.sleep)
    assert 600 <= len([t for t in send_times(within_a_minute, clock, 700) if t < 60]) <= 610


def test_the_limiter_holds_the_tokens_a_minute_and_counts_what_replies_used() -> None:
    clock = FakeClock()
    limiter = RateLimiter(tpm=6000, clock=clock, sleep=clock.sleep)  # 100 tokens a second
    times = send_times(limiter, clock, 5, tokens=100)
    assert times == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0])
    # A request estimated at 100 that used 400 leaves the bucket 300 short: 3 s more.
    limiter.settle(100, {"messages": []}, {"prompt_tokens": 350, "total_tokens": 400})
    assert send_times(limiter, clock, 1, tokens=100) == pytest.approx([4.0 + 4.0])


def test_the_server_rate_limit_headers_hold_requests_until_the_reset() -> None:
    clock = FakeClock()
    limiter = RateLimiter(clock=clock, sleep=clock.sleep)  # no rpm: the server's word only
    limiter.observe({"x-ratelimit-remaining-requests": "0",
                     "x-ratelimit-reset-requests": "1m30s"})
    assert limiter.waiting() == (90.0, "rate limited")
    assert send_times(limiter, clock, 1) == [90.0]
    limiter.observe({"x-ratelimit-remaining-tokens": "50", "x-ratelimit-reset-tokens": "20ms",
                     "x-ratelimit-remaining-requests": "99", "x-ratelimit-reset-requests": "1s"})
    assert send_times(limiter, clock, 1, tokens=80) == [pytest.approx(90.02)]
    assert [parse_duration(v) for v in ("6m0s", "1.5", "20ms", "2h", "soon")] \
        == [360.0, 1.5, 0.02, 7200.0, None]
    assert retry_after_s({"retry-after": "90"}) == 90.0
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "9"}) == 0.25


def test_a_429_storm_longer_than_the_sdk_retries_is_waited_out(
        backends: list[OpenAIBackend]) -> None:
    """The SDK gave up after 4 retries (about 15 s at its backoff); the run waits as long as
    its patience allows, every request paused together by the server's Retry-After."""
    with FakeOpenAIServer() as server:
        server.script(*[Reply(status=429, body={"error": {"message": "slow down"}})] * 8,
                      *[Reply(status=429, headers={"Retry-After": "0.05"})] * 3)
        backend = backend_on(server, backends, max_retries=None, patience_s=60.0)
        assert backend.generate([ask("a"), ask("b")]) == ["echo: a", "echo: b"]
    assert len(server.requests) == 13


def test_a_server_down_past_the_patience_stops_with_one_line(
        backends: list[OpenAIBackend]) -> None:
    with FakeOpenAIServer(lambda _: Reply(status=503, body={"error": "down"})) as server:
        backend = backend_on(server, backends, max_retries=None, patience_s=1.0)
        with pytest.raises(BackendUnavailableError) as error:
            backend.generate([ask("q")])
    message = str(error.value)
    assert "\n" not in message and server.base_url in message
    assert "past the patience of 1 s" in message and "HTTP 503" in message
    assert len(server.requests) >= 2 and f"({len(server.requests)} attempt(s)" in message


def test_a_retry_after_longer_than_the_patience_left_stops_at_once(
        backends: list[OpenAIBackend]) -> None:
    with FakeOpenAIServer() as server:
        server.script(Reply(status=429, headers={"Retry-After": "90"}))
        backend = backend_on(server, backends, max_retries=None, patience_s=30.0)
        with pytest.raises(BackendUnavailableError, match="asks for 90 s more.*patience of 30"):
            backend.generate([ask("q")])
    assert len(server.requests) == 1


def test_the_progress_line_says_when_requests_resume(backends: list[OpenAIBackend],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeOpenAIServer() as server:
        server.script(Reply(status=429, headers={"Retry-After": "1.5"}))
        backend = backend_on(server, backends, max_retries=None, patience_s=60.0)
        assert backend.waiting() is None
        seen: list[str | None] = []
        original = RateLimiter.acquire

        async def watched(limiter: RateLimiter, tokens: int) -> None:
            seen.append(backend.waiting())
            await original(limiter, tokens)

        monkeypatch.setattr(RateLimiter, "acquire", watched)
        assert backend.generate([ask("q")]) == ["echo: q"]
    assert seen == [None, "rate limited: resuming in 2 s"]


def test_dropped_connections_and_replies_cut_short_are_retried(
        backends: list[OpenAIBackend]) -> None:
    with FakeOpenAIServer() as server:
        server.script(Reply(drop=True), Reply(body='{"choices": ['), Reply(drop=True))
        backend = backend_on(server, backends, max_retries=None, patience_s=60.0)
        assert backend.generate([ask("q")]) == ["echo: q"]
    assert len(server.requests) == 4 and server.tokens_served["prompt_tokens"] == 10


def test_an_account_out_of_quota_is_not_waited_for(backends: list[OpenAIBackend]) -> None:
    with FakeOpenAIServer() as server:
        server.script(Reply(status=429, body={"error": {
            "message": "You exceeded your current quota.", "code": "insufficient_quota"}}))
        backend = backend_on(server, backends, max_retries=None, patience_s=3600.0)
        with pytest.raises(SieveragError, match="quota.*plan and billing") as error:
            backend.generate([ask("q")])
    assert not isinstance(error.value, BackendUnavailableError)
    assert len(server.requests) == 1


def reasoning_reply(request: RecordedRequest) -> Reply:
    return Reply(body=chat_reply("fine", prompt_tokens=20, completion_tokens=2))


def test_a_reasoning_model_gets_max_completion_tokens_and_no_temperature(
        backends: list[OpenAIBackend]) -> None:
    faults = FaultSchedule(reasoning_models=frozenset({"o-reasoner"}))
    with FakeOpenAIServer(reasoning_reply, faults=faults) as server:
        backend = backend_on(server, backends, model="o-reasoner", max_concurrency=1)
        settings = GenerationSettings(max_new_tokens=64)
        replies = backend.chat([ask("a"), ask("b"), ask("c")], settings)
    assert [r.text for r in replies] == ["fine"] * 3
    # Each refusal met once, remembered for the rest of the run.
    bodies = [request.json for request in server.requests]
    assert len(bodies) == 5 and faults.faults == {"400 max_tokens": 1, "400 temperature": 1}
    assert all(b["max_completion_tokens"] == 64 and "max_tokens" not in b
               and "temperature" not in b for b in bodies[2:])
    assert backend.adaptations == [
        "sends max_completion_tokens (the server refused max_tokens)",
        "leaves temperature out (the server refused it)"]
    # Reasoning tokens are counted, inside the completion tokens, as OpenAI bills them.
    assert replies[0].usage == ReplyUsage(prompt_tokens=20, completion_tokens=8,
                                          reasoning_tokens=6, cached_tokens=0)
    assert backend.chat_request(ask("d"), settings) == {
        "model": "o-reasoner", "messages": ask("d"), "max_completion_tokens": 64}


def test_other_servers_get_the_request_unchanged(backends: list[OpenAIBackend]) -> None:
    with FakeOpenAIServer() as server:
        backend = backend_on(server, backends)
        backend.generate([ask("q")], GenerationSettings(max_new_tokens=7))
        explicit = backend_on(server, backends, token_field="max_completion_tokens")
        explicit.generate([ask("q")], GenerationSettings(max_new_tokens=7))
    first, second = (request.json for request in server.requests)
    assert first["max_tokens"] == 7 and first["temperature"] == 0.0
    assert "max_completion_tokens" not in first
    assert second["max_completion_tokens"] == 7 and "max_tokens" not in second
    assert backend.adaptations == []


def test_pacing_settings_are_checked_naming_the_field() -> None:
    for field, value in (("rpm", 0), ("tpm", -5), ("patience_s", 0.0),
                         ("token_field", "max_length")):
        with pytest.raises(ValueError, match=field):
            OpenAIBackendConfig(base_url="http://127.0.0.1:1/v1", model="m", **{field: value})
