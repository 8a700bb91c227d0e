"""A fault schedule for `FakeOpenAIServer`: what a hosted API does to a long labelling run.

`FaultSchedule` turns some requests into faults before the server's script or responder sees
them: windows of 429 with `Retry-After` (from `Throttle.start_s` to `end_s`, seconds since the
first request arrived), and a seeded share of HTTP 500s, hangs (no reply until `hang_s`, past the
client's timeout; then a 504 nobody reads), replies cut short (JSON that does not parse, with
no usage in it) and dropped connections. Which attempt of which request fails is decided by
sha256 of (seed, the request's body, how many times that body came before), so a run on the
same requests meets the same faults whatever their order. A model named in
`reasoning_models` refuses `max_tokens` and a temperature other than 1 the way OpenAI's
reasoning models do (HTTP 400 naming the field), and its replies count reasoning tokens.

Only complete 200 replies with a usage carry tokens: the server counts them in
`FakeOpenAIServer.tokens_served` (and lists each in `served`), the figure a client's ledger
must equal.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fake_openai_server import RecordedRequest, Reply

MAX_TOKENS_REFUSAL = {"error": {
    "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
               "'max_completion_tokens' instead.",
    "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}}
TEMPERATURE_REFUSAL = {"error": {
    "message": "Unsupported value: 'temperature' does not support 0.0 with this model. Only "
               "the default (1) value is supported.",
    "type": "invalid_request_error", "param": "temperature", "code": "unsupported_value"}}
# A reasoning model's hidden tokens per reply token (counted, billed as completion tokens).
REASONING_PER_TOKEN = 3


@dataclass(frozen=True)
class Throttle:
    """429 with `Retry-After: retry_after_s` for every request from `start_s` to `end_s`."""

    start_s: float
    end_s: float
    retry_after_s: float


@dataclass
class FaultSchedule:
    """Which requests fail, and how (see the module docstring); shares are of attempts."""

    seed: int = 0
    throttles: tuple[Throttle, ...] = ()
    error_share: float = 0.0
    hang_share: float = 0.0
    hang_s: float = 30.0
    malformed_share: float = 0.0
    drop_share: float = 0.0
    reasoning_models: frozenset[str] = frozenset()
    seen: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    origin_s: float | None = None
    log: list[tuple[float, str]] = field(default_factory=list)
    """(seconds since the server started, the fault or "ok") of each request, in order."""
    _last: str = field(default="", repr=False)

    def fault(self, request: RecordedRequest, elapsed_s: float) -> Reply | None:
        """The fault this request meets (called under the server's lock), or None."""
        reply = self._fault(request, elapsed_s)
        self.log.append((elapsed_s, "ok" if reply is None else self._last))
        return reply

    def _fault(self, request: RecordedRequest, elapsed_s: float) -> Reply | None:
        if self.origin_s is None:
            self.origin_s = elapsed_s
        for throttle in self.throttles:
            if throttle.start_s <= elapsed_s - self.origin_s < throttle.end_s:
                self._count("429")
                return Reply(status=429, headers={"Retry-After": f"{throttle.retry_after_s:g}"},
                             body={"error": {"message": "Rate limit reached; try again later.",
                                             "type": "requests", "code": "rate_limit_exceeded"}})
        body = request.json if isinstance(request.json, dict) else {}
        chat = request.path.endswith("/chat/completions")
        if chat and body.get("model") in self.reasoning_models:
            if "max_tokens" in body:
                self._count("400 max_tokens")
                return Reply(status=400, body=MAX_TOKENS_REFUSAL)
            if body.get("temperature", 1) != 1:
                self._count("400 temperature")
                return Reply(status=400, body=TEMPERATURE_REFUSAL)
        digest = hashlib.sha256(request.raw).hexdigest()
        draw = _uniform(self.seed, digest, self.seen[digest])
        self.seen[digest] += 1
        for name, share, reply in (
                ("500", self.error_share, Reply(status=500, body={"error": {
                    "message": "The server had an error while processing your request."}})),
                ("hang", self.hang_share, Reply(status=504, delay_s=self.hang_s, body={
                    "error": {"message": "gateway timeout"}})),
                ("malformed", self.malformed_share,
                 Reply(body='{"id": "chatcmpl-cut", "object": "chat.completion", "choices": [')),
                ("drop", self.drop_share, Reply(drop=True))):
            if draw < share:
                self._count(name)
                return reply
            draw -= share
        return None

    def _count(self, name: str) -> None:
        self.faults[name] += 1
        self._last = name

    def finish(self, request: RecordedRequest, reply: Reply) -> Reply:
        """A reasoning model's reply counts its hidden reasoning tokens too."""
        body = request.json if isinstance(request.json, dict) else {}
        usage = reply.body.get("usage") if isinstance(reply.body, dict) else None
        if body.get("model") not in self.reasoning_models or not isinstance(usage, dict):
            return reply
        reasoning = REASONING_PER_TOKEN * usage.get("completion_tokens", 0)
        completion = usage.get("completion_tokens", 0) + reasoning
        usage = {**usage, "completion_tokens": completion,
                 "total_tokens": usage.get("prompt_tokens", 0) + completion,
                 "completion_tokens_details": {"reasoning_tokens": reasoning}}
        return Reply(status=reply.status, body={**reply.body, "usage": usage},
                     headers=reply.headers, delay_s=reply.delay_s)


def request_tokens(messages: list[dict[str, Any]]) -> int:
    """A fake tokenizer's count of a prompt: one token per 4 bytes of each message, plus 4."""
    return sum(math.ceil(len(json.dumps(m["content"]).encode()) / 4) + 4 for m in messages)


def _uniform(seed: int, digest: str, attempt: int) -> float:
    """A number in [0, 1) fixed by (seed, request body, attempt)."""
    value = hashlib.sha256(f"{seed}:{digest}:{attempt}".encode()).digest()
    return int.from_bytes(value[:8], "big") / 2 ** 64
