"""How the `openai` backend's requests reach the server: JSON payloads POSTed through the
`openai` SDK's async client, concurrently, on a private event-loop thread, paced, retried for
as long as the caller's patience lasts, and adapted to what the server accepts.

The client runs on the SDK's aiohttp transport where it has one, at most `max_concurrency`
requests in flight, on a private event-loop thread, so the synchronous `post_all` also works
when called from code that runs its own event loop. Every request waits its turn in one
`RateLimiter` (inference/llm/rate_limit.py: `rpm`, `tpm` and the server's rate-limit
headers). The retries are this module's, not the SDK's (its `max_retries` is 0): a 429, a
5xx, a 408 or 409, a timeout, a dropped connection or a reply cut short (JSON that does not
parse) is sent again after `backoff_s` doubling (at most a minute), with jitter; a
`Retry-After` wins, and on a 429 it pauses every request, not just the one. A request gives up
after `max_retries` retries (None: no count) or once it has been failing for `patience_s`
seconds, whichever comes first, with `BackendUnavailableError`; so does a reply that is not
JSON at all (an HTML page: base_url is not the API). A 429 saying the account is out of quota
and any other 4xx fail at once with the server's own message. Without a key no
Authorization header is sent.

Servers differ in what they accept. With `token_field="auto"` a chat request asks for
`max_tokens`, and once a server refuses it naming `max_completion_tokens` (OpenAI's reasoning
models) every request of the run sends that instead; a server that refuses `temperature` (the
same models) gets requests without it from then on. `adaptations` lists what was learned.

What is asked, and how the replies are read, is `openai_backend.OpenAIBackend`'s part.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time
import weakref
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import openai

from sieverag.inference.core.errors import BackendUnavailableError, SieveragError
from sieverag.inference.llm.rate_limit import RateLimiter, retry_after_s

T = TypeVar("T")
# The longest wait between two attempts of one request, however many failed before.
_LONGEST_BACKOFF_S = 60.0
# The statuses retried besides 5xx; past the retries or the patience, the server is unavailable.
_RETRIED_STATUSES = frozenset({408, 409, 429})
# Asks the SDK for the reply with its headers (what `with_raw_response` sends).
_RAW_REPLY = {"X-Stainless-Raw-Response": "true"}
Endpoint = Literal["chat/completions", "completions"]
TokenField = Literal["auto", "max_tokens", "max_completion_tokens"]


@dataclass
class _Dialect:
    """What the server accepts, as set or learned from its refusals: the reply-length field of
    a chat request, and whether `temperature` may be sent."""

    token_field: TokenField
    temperature: bool = True
    learned: list[str] = field(default_factory=list)

    def adapt(self, endpoint: Endpoint, payload: dict[str, Any]) -> dict[str, Any]:
        """The payload as this server wants it."""
        renamed = (endpoint == "chat/completions" and "max_tokens" in payload
                   and self.token_field == "max_completion_tokens")
        if not renamed and (self.temperature or "temperature" not in payload):
            return payload
        adapted = {k: v for k, v in payload.items()
                   if k != "temperature" or self.temperature}
        if renamed:
            adapted["max_completion_tokens"] = adapted.pop("max_tokens")
        return adapted

    def learn(self, endpoint: Endpoint, sent: Mapping[str, Any], refusal: str) -> bool:
        """Whether a 400's text (`refusal`, lower-cased) names a field this server refuses
        that can be left out or renamed; if so it is remembered, and the request is to be sent
        again."""
        if (endpoint == "chat/completions" and "max_tokens" in sent
                and self.token_field == "auto" and "max_completion_tokens" in refusal):
            self.token_field = "max_completion_tokens"
            self.learned.append("sends max_completion_tokens (the server refused max_tokens)")
            return True
        if ("temperature" in sent and self.temperature and "temperature" in refusal
                and any(word in refusal for word in ("unsupported", "not support", "only the "
                                                     "default", "does not accept"))):
            self.temperature = False
            self.learned.append("leaves temperature out (the server refused it)")
            return True
        return False


class SieveragOpenAI(openai.AsyncOpenAI):
    """The SDK's async client under its own name (the user agent `SieveragOpenAI/Python <SDK
    version>`); it never retries (`max_retries=0`): the transport does."""


@dataclass
class _Session:
    """The private event loop, its thread, the client, pool and limiter bound to it; `end`
    closes them, once: when the transport is closed, collected, or the interpreter exits (an
    aiohttp session left open complains on stderr)."""

    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    client: SieveragOpenAI
    slots: asyncio.Semaphore
    limiter: RateLimiter
    end: weakref.finalize


@dataclass
class _Failure:
    """Why an attempt failed, and the wait the server asked for (None: it asked for none)."""

    what: str
    retry_after: float | None = None
    rate_limited: bool = False


@dataclass(eq=False, kw_only=True)
class OpenAITransport:
    """Posts JSON payloads to one OpenAI-compatible server (`base_url`, serving `model`) and
    returns the parsed replies; the client, its pool and its event loop start on the first
    request and end on `close` (a later request starts them again) or when collected. `key`:
    the bearer token sent, None for no Authorization header. `max_retries` None: a request
    is retried for as long as `patience_s` lasts. `rpm`, `tpm`: the pace (None: only the
    server's headers pace)."""

    base_url: str
    model: str
    key: str | None = field(repr=False)
    max_concurrency: int
    timeout_s: float
    max_retries: int | None
    backoff_s: float
    patience_s: float = 120.0
    rpm: int | None = None
    tpm: int | None = None
    token_field: TokenField = "auto"
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _session: _Session | None = field(default=None, init=False, repr=False)
    _dialect: _Dialect = field(init=False, repr=False)
    _waits: dict[int, tuple[float, str]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._dialect = _Dialect(self.token_field)

    @property
    def adaptations(self) -> list[str]:
        """What this run learned the server wants (sent that way from then on), in order."""
        return list(self._dialect.learned)

    def adapted(self, endpoint: Endpoint, payload: dict[str, Any]) -> dict[str, Any]:
        """`payload` as this server wants it: `token_field`, and what its refusals taught."""
        return self._dialect.adapt(endpoint, payload)

    def waiting(self) -> str | None:
        """What holds requests back now, for a progress bar ("rate limited: resuming in
        42 s"); None when nothing does. Safe to call from any thread."""
        now = time.monotonic()
        held = [(until - now, why) for until, why in list(self._waits.values())]
        session = self._session
        if session is not None and (paused := session.limiter.waiting()) is not None:
            held.append(paused)
        if not held:
            return None
        seconds, why = max(held)
        return f"{why}: resuming in {math.ceil(seconds)} s" if seconds > 0 else None

    @property
    def _headers(self) -> Mapping[str, Any]:
        """Without a key the SDK's Authorization header is left out of every request."""
        return {**_RAW_REPLY, **({"Authorization": openai.Omit()} if self.key is None else {})}

    def post_all(self, endpoint: Endpoint, payloads: list[dict[str, Any]]) -> list[Any]:
        """Send every payload to `endpoint` concurrently; the parsed replies in payload order.
        Raises `BackendUnavailableError` once a request's retries or patience run out,
        `SieveragError` for a request the server refuses."""
        if not payloads:
            return []
        session = self._started()
        return self._run(session, self._gather(session, endpoint, payloads))

    def close(self) -> None:
        """Close the connections and stop the private event loop (a later call restarts it)."""
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            session.end()

    @staticmethod
    def _run(session: _Session, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run on the private loop, so callers that run their own event loop are fine."""
        future = asyncio.run_coroutine_threadsafe(coroutine, session.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # an interrupted caller must not leave requests running
            raise

    def _started(self) -> _Session:
        with self._lock:
            if self._session is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="openai-backend",
                                          daemon=True)
                thread.start()
                # Made on the loop, where the client's connection pool will live.
                client = asyncio.run_coroutine_threadsafe(self._client(), loop).result()
                self._session = _Session(
                    loop, thread, client, asyncio.Semaphore(self.max_concurrency),
                    RateLimiter(self.rpm, self.tpm),
                    weakref.finalize(self, _end_session, loop, thread, client))
            return self._session

    async def _client(self) -> SieveragOpenAI:
        return SieveragOpenAI(base_url=self.base_url, api_key=self.key or "none",
                              timeout=self.timeout_s, max_retries=0,
                              http_client=_http_client())

    async def _gather(self, session: _Session, endpoint: Endpoint,
                      payloads: list[dict[str, Any]]) -> list[Any]:
        """All replies in order; the first failure cancels the requests still running."""
        tasks = [asyncio.ensure_future(self._send(session, endpoint, payload))
                 for payload in payloads]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _send(self, session: _Session, endpoint: Endpoint,
                    payload: dict[str, Any]) -> Any:
        """One request, paced and retried; its parsed reply. Raises `BackendUnavailableError`
        once the retries or the patience run out, `SieveragError` for a request the server
        refuses."""
        url = f"{self.base_url}/{endpoint}"
        failing_since: float | None = None
        failures = 0
        async with session.slots:
            while True:
                body = self._dialect.adapt(endpoint, payload)
                estimate = session.limiter.estimate(body)
                await session.limiter.acquire(estimate)
                outcome = await self._attempt(session, url, endpoint, body, estimate)
                if outcome is None:  # the server refused a field, now adapted to: again
                    continue
                if not isinstance(outcome, _Failure):
                    return outcome
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                failures += 1
                if self.max_retries is not None and failures > self.max_retries:
                    raise self._unavailable(url, outcome.what, failures)
                delay = self._delay(failures, outcome)
                if now + delay - failing_since > self.patience_s:
                    raise self._out_of_patience(url, outcome, failures, now - failing_since)
                why = "rate limited" if outcome.rate_limited else outcome.what.split(" (")[0]
                if outcome.rate_limited or outcome.retry_after is not None:
                    session.limiter.pause(delay, why)  # the server asked: every request waits
                    continue
                key = id(asyncio.current_task())
                self._waits[key] = (now + delay, why)
                try:
                    await asyncio.sleep(delay)
                finally:
                    self._waits.pop(key, None)

    def _delay(self, failures: int, failure: _Failure) -> float:
        """Seconds before the next attempt of a request that failed `failures` times: the
        server's Retry-After, else `backoff_s` doubling (at most a minute), with jitter."""
        if failure.retry_after is not None:
            return failure.retry_after
        backoff = min(_LONGEST_BACKOFF_S, self.backoff_s * 2 ** (failures - 1))
        return backoff * random.uniform(0.5, 1.0)

    async def _attempt(self, session: _Session, url: str, endpoint: Endpoint,
                       body: dict[str, Any], estimate: int) -> Any:
        """One attempt: the parsed reply, the `_Failure` to retry, or None where the server
        refused a field the dialect has now adapted to. Raises for what retrying cannot fix."""
        try:
            # The SDK's generic POST (its documented way to any endpoint), the reply with its
            # headers, parsed as plain JSON: the payloads are JSON already, and `create()`
            # would walk each through the SDK's parameter transforms, and building its typed
            # reply would walk the reply, which together cost more CPU than the old client's.
            raw = await session.client.post(f"/{endpoint}", body=body, cast_to=object,
                                            options={"headers": self._headers})
        except openai.APIStatusError as error:
            headers = error.response.headers
            session.limiter.observe(headers)
            status = error.status_code
            refusal = f"{error.body} {error.response.text[:500]}".lower()
            if status == 400 and self._dialect.learn(endpoint, body, refusal):
                return None
            if "insufficient_quota" in refusal or (
                    status not in _RETRIED_STATUSES and status < 500):
                raise SieveragError(self._rejection(url, error)) from None
            return _Failure(f"HTTP {status} ({str(error.body)[:200]!r})",
                            retry_after_s(headers), rate_limited=status == 429)
        except openai.APITimeoutError:
            return _Failure(f"no reply within timeout_s={self.timeout_s}")
        except openai.APIConnectionError as error:
            cause = error.__cause__ or error
            return _Failure(f"a dropped connection ({type(cause).__name__}: {cause})")
        session.limiter.observe(raw.headers)
        try:
            reply = raw.parse()
        except ValueError as error:  # JSON cut short: a fault on the way, worth another try
            return _Failure(f"a reply that is not valid JSON ({error})")
        if not isinstance(reply, dict):  # the SDK returns a body not sent as JSON as text
            raise self._not_json(url, f"{str(reply)[:100]!r}")
        session.limiter.settle(estimate, body, reply.get("usage") or {})
        return reply

    def _not_json(self, url: str, detail: str) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"the LLM server at {url} sent a reply that is not valid JSON ({detail}); is "
            "base_url the server's OpenAI-compatible base URL (ending in /v1)?")

    def _unavailable(self, url: str, failure: str, attempts: int) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"the LLM server at {url} failed {attempts} attempt(s), last with {failure}; is "
            "the server running? start it with `sieverag serve ...` (or `vllm serve`), or "
            "point base_url at a running one")

    def _out_of_patience(self, url: str, failure: _Failure, attempts: int,
                         failing_s: float) -> BackendUnavailableError:
        asked = ("" if failure.retry_after is None else
                 f", and it asks for {failure.retry_after:.0f} s more")
        return BackendUnavailableError(
            f"the LLM server at {url} has failed for {failing_s:.0f} s ({attempts} "
            f"attempt(s), last with {failure.what}{asked}), past the patience of "
            f"{self.patience_s:g} s; is the server up? rerun when it is, or with a longer "
            "patience")

    def _rejection(self, url: str, error: openai.APIStatusError) -> str:
        """The message for a 4xx reply that retrying cannot fix."""
        body = error.body  # the SDK's: the body's "error" object, or the body itself
        message: Any = body.get("message", body) if isinstance(body, dict) else body
        if not message:
            message = error.response.text[:300]
        hint = {401: "check the key in api_key_env", 403: "check the key in api_key_env",
                404: f"check base_url and that the server serves model {self.model!r}",
                429: "the account is out of quota: check its plan and billing"}
        advice = hint.get(error.status_code, "check the request settings")
        if error.status_code == 400 and "logprob" in str(message).lower():
            advice = ("the server does not return the log-probs asked for: ask for fewer "
                      "(top_logprobs) or serve the model with more (vLLM's --max-logprobs; "
                      "`sieverag serve --engine vllm --vllm.max-logprobs N`)")
        return (f"the LLM server at {url} rejected the request with HTTP "
                f"{error.status_code}: {message}; {advice}")


def _end_session(loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                 client: SieveragOpenAI) -> None:
    """Close `client` on `loop`, then stop the loop and its thread. Run on the loop's own
    thread (the transport collected there), it can only ask for the close, not wait for it."""
    if threading.current_thread() is thread:
        loop.create_task(client.close())
        return
    asyncio.run_coroutine_threadsafe(client.close(), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def _http_client() -> Any:
    """The SDK's aiohttp transport where it has one and aiohttp is installed (it comes with
    `datasets`): it spends half the CPU per request of the SDK's default httpx transport
    (tests/benchmarks/bench_openai_client.py). None: the SDK's default."""
    aiohttp_client = getattr(openai, "DefaultAioHttpClient", None)
    if aiohttp_client is None:
        return None
    try:
        return aiohttp_client()
    except RuntimeError:  # the SDK says aiohttp is missing
        return None
