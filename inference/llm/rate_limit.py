"""Pacing the requests of one client to a server that limits them (a hosted API's requests and
tokens a minute), shared by every request in flight.

`RateLimiter` keeps two token buckets, one on requests a minute (`rpm`) and one on tokens a
minute (`tpm`, each request weighed by its estimated size until its reply says how many it
used), each holding at most one second's worth, so the pace is steady rather than bursts.
It also takes the server's word: a `Retry-After` (on a 429, or a 503) pauses every request
until then, and `x-ratelimit-remaining-requests` / `-tokens` at 0 (or below the next
request's size) hold requests until `x-ratelimit-reset-requests` / `-tokens`. Without `rpm`
and `tpm` only the server's headers pace. Every method runs on the event loop of the requests
it paces, except `waiting`, which a progress bar reads from any thread.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

# OpenAI's reset durations: "1s", "6m0s", "20ms", "1m30.5s", "2h0m0s".
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# Bytes of a prompt a token stands for, at a guess, until replies tell (BPE on English: ~4).
_BYTES_PER_TOKEN = 4.0


def parse_duration(value: str | None) -> float | None:
    """Seconds from a rate-limit reset header: a number of seconds or OpenAI's "1m30.5s" form;
    None when absent or unreadable."""
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            return None
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    """The wait a reply asks for: `retry-after-ms`, else `Retry-After` in seconds or as an
    HTTP date; None when it asks for none."""
    if headers is None:
        return None
    milliseconds = parse_duration(headers.get("retry-after-ms"))
    if milliseconds is not None:
        return milliseconds / 1000
    value = headers.get("retry-after")
    seconds = parse_duration(value)
    if seconds is not None or value is None:
        return seconds
    try:
        date = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, date.timestamp() - time.time())


def prompt_bytes(payload: Mapping[str, Any]) -> int:
    """The UTF-8 size of what a request asks the model to read (its messages or prompt)."""
    if "messages" in payload:
        return sum(len(str(m.get("content") or "").encode()) + 8 for m in payload["messages"])
    prompt = payload.get("prompt", "")
    if isinstance(prompt, list):  # token ids
        return int(len(prompt) * _BYTES_PER_TOKEN)
    return len(str(prompt).encode())


def reply_limit(payload: Mapping[str, Any]) -> int:
    """The reply tokens a request allows (what a server counts against its token limit)."""
    return int(payload.get("max_completion_tokens") or payload.get("max_tokens") or 0)


@dataclass
class _Bucket:
    """A token bucket refilled at `per_minute`, holding at most one second's worth (at least
    one request's)."""

    per_minute: float
    level: float = math.nan
    stamp: float = math.nan

    @property
    def capacity(self) -> float:
        return max(1.0, self.per_minute / 60)

    def wait(self, amount: float, now: float) -> float:
        """Seconds until `amount` can be taken (one larger than the bucket waits for a full
        bucket and leaves it in debt)."""
        if math.isnan(self.level):
            self.level, self.stamp = self.capacity, now
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.per_minute / 60)
        self.stamp = now
        short = min(amount, self.capacity) - self.level
        return max(0.0, short * 60 / self.per_minute)

    def take(self, amount: float) -> None:
        self.level -= amount


@dataclass
class _ServerCount:
    """What the server last said is left of one limit, and when it resets."""

    remaining: float = math.inf
    resets_at: float = 0.0


class RateLimiter:
    """Paces the requests of one client: `await acquire(tokens)` before each send,
    `settle(estimate, used)` and `observe(headers)` after each reply, `pause(seconds)` when
    the server asks for a wait."""

    def __init__(self, rpm: int | None = None, tpm: int | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.clock = clock
        self.sleep = sleep
        self._requests = _Bucket(float(rpm)) if rpm else None
        self._tokens = _Bucket(float(tpm)) if tpm else None
        self._server_requests = _ServerCount()
        self._server_tokens = _ServerCount()
        self._paused_until = 0.0
        self._pause_reason = ""
        self._bytes_per_token = _BYTES_PER_TOKEN
        self._queue: asyncio.Lock | None = None

    def estimate(self, payload: Mapping[str, Any]) -> int:
        """The tokens a request will count against a token limit, at a guess: its prompt (by
        the bytes a token stood for in the replies so far) plus the reply it allows."""
        return math.ceil(prompt_bytes(payload) / self._bytes_per_token) + reply_limit(payload)

    async def acquire(self, tokens: int) -> None:
        """Wait until one more request of `tokens` (estimated) fits every limit, then count it.
        Callers are served in arrival order."""
        if self._queue is None:
            self._queue = asyncio.Lock()
        async with self._queue:
            # Waits under a microsecond are float rounding (a refill a hair short), not waits.
            while (delay := self._delay(tokens)) > 1e-6:
                await self.sleep(delay)
            for bucket, amount in ((self._requests, 1), (self._tokens, tokens)):
                if bucket is not None:
                    bucket.take(amount)
            self._server_requests.remaining -= 1
            self._server_tokens.remaining -= tokens

    def settle(self, estimated: int, payload: Mapping[str, Any], usage: Mapping[str, Any]) -> None:
        """A reply came: count the tokens it really used instead of the estimate, and learn
        the bytes a prompt token stands for."""
        prompt_tokens = usage.get("prompt_tokens")
        if isinstance(prompt_tokens, int) and prompt_tokens > 0:
            seen = prompt_bytes(payload) / prompt_tokens
            self._bytes_per_token = 0.9 * self._bytes_per_token + 0.1 * seen
        used = usage.get("total_tokens")
        if self._tokens is not None and isinstance(used, int):
            self._tokens.take(used - estimated)

    def observe(self, headers: Mapping[str, str] | None) -> None:
        """Read a reply's `x-ratelimit-remaining-*` / `x-ratelimit-reset-*` headers."""
        if headers is None:
            return
        now = self.clock()
        for kind, count in (("requests", self._server_requests), ("tokens", self._server_tokens)):
            remaining = parse_duration(headers.get(f"x-ratelimit-remaining-{kind}"))
            reset = parse_duration(headers.get(f"x-ratelimit-reset-{kind}"))
            if remaining is not None and reset is not None:
                count.remaining, count.resets_at = remaining, now + reset

    def pause(self, seconds: float, reason: str) -> None:
        """Hold every request for `seconds` from now (a longer pause already set stays)."""
        until = self.clock() + seconds
        if until > self._paused_until:
            self._paused_until, self._pause_reason = until, reason

    def waiting(self) -> tuple[float, str] | None:
        """(seconds left, why) while requests are held by a pause or the server's limits;
        None when they are not."""
        now = self.clock()
        held = [(self._paused_until - now, self._pause_reason)]
        for count in (self._server_requests, self._server_tokens):
            if count.remaining <= 0:
                held.append((count.resets_at - now, "rate limited"))
        seconds, reason = max(held)
        return (seconds, reason) if seconds > 0 else None

    def _delay(self, tokens: int) -> float:
        now = self.clock()
        delays = [self._paused_until - now]
        if self._server_requests.remaining < 1:
            delays.append(self._server_requests.resets_at - now)
        if self._server_tokens.remaining < tokens:
            delays.append(self._server_tokens.resets_at - now)
        if self._requests is not None:
            delays.append(self._requests.wait(1, now))
        if self._tokens is not None:
            delays.append(self._tokens.wait(tokens, now))
        return max(delays)
