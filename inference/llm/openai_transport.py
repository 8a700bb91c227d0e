"""How the `openai` backend's requests reach the server: JSON payloads POSTed through the
`openai` SDK's async client, concurrently, on a private event-loop thread.

The client runs on the SDK's aiohttp transport where it has one, at most `max_concurrency`
requests in flight, on a private event-loop thread, so the synchronous `post_all` also works
when called from code that runs its own event loop. The SDK retries rate limits (429), server
errors (5xx), 408 and 409, timeouts and dropped connections (`max_retries` times, after
`backoff_s` doubling, with jitter; a Retry-After of up to a minute wins); when the retries run
out the call raises `BackendUnavailableError`, as it does at once for a reply that is not
valid JSON. Any other 4xx fails at once with the server's own error message. Without a key no
Authorization header is sent.

What is asked, and how the replies are read, is `openai_backend.OpenAIBackend`'s part.
"""

from __future__ import annotations

import asyncio
import random
import threading
import weakref
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import openai

from sieverag.inference.core.errors import BackendUnavailableError, SieveragError

T = TypeVar("T")
# A Retry-After the client waits for (longer ones, too: the SDK then gives up at once).
_LONGEST_RETRY_AFTER_S = 60.0
# The statuses the SDK retries; once its retries run out, the server counts as unavailable.
_RETRIED_STATUSES = frozenset({408, 409, 429})
Endpoint = Literal["chat/completions", "completions"]


class SieveragOpenAI(openai.AsyncOpenAI):
    """The SDK's async client (its user agent `SieveragOpenAI/Python <SDK version>`), its first
    retry delay `backoff_s` (the SDK's is a fixed 0.5 s), doubling on each retry, with jitter;
    a Retry-After the server sends wins, as in the SDK."""

    def __init__(self, *, backoff_s: float, **options: Any) -> None:
        super().__init__(**options)
        self.backoff_s = backoff_s

    def _calculate_retry_timeout(self, remaining_retries: int, options: Any,
                                 response_headers: Any = None) -> float:
        retry_after = self._parse_retry_after_header(response_headers)
        if retry_after is not None and 0 < retry_after <= _LONGEST_RETRY_AFTER_S:
            return retry_after
        retries_taken = options.get_max_retries(self.max_retries) - remaining_retries
        return self.backoff_s * 2 ** retries_taken * random.uniform(0.5, 1.0)


@dataclass
class _Session:
    """The private event loop, its thread, and the client and pool bound to it; `end` closes
    them, once: when the transport is closed, collected, or the interpreter exits (an aiohttp
    session left open complains on stderr)."""

    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    client: SieveragOpenAI
    slots: asyncio.Semaphore
    end: weakref.finalize


@dataclass(eq=False, kw_only=True)
class OpenAITransport:
    """Posts JSON payloads to one OpenAI-compatible server (`base_url`, serving `model`) and
    returns the parsed replies; the client, its pool and its event loop start on the first
    request and end on `close` (a later request starts them again) or when collected. `key`:
    the bearer token sent, None for no Authorization header."""

    base_url: str
    model: str
    key: str | None = field(repr=False)
    max_concurrency: int
    timeout_s: float
    max_retries: int
    backoff_s: float
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _session: _Session | None = field(default=None, init=False, repr=False)

    @property
    def _headers(self) -> Mapping[str, Any]:
        """Without a key the SDK's Authorization header is left out of every request."""
        return {"Authorization": openai.Omit()} if self.key is None else {}

    def post_all(self, endpoint: Endpoint, payloads: list[dict[str, Any]]) -> list[Any]:
        """Send every payload to `endpoint` concurrently; the parsed replies in payload order.
        Raises `BackendUnavailableError` once a request's retries run out, `SieveragError` for
        a request the server refuses."""
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
                    weakref.finalize(self, _end_session, loop, thread, client))
            return self._session

    async def _client(self) -> SieveragOpenAI:
        return SieveragOpenAI(base_url=self.base_url, api_key=self.key or "none",
                              timeout=self.timeout_s, max_retries=self.max_retries,
                              backoff_s=self.backoff_s, http_client=_http_client())

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
        """One request, retried by the SDK; its parsed reply. Raises `BackendUnavailableError`
        once the retries run out, `SieveragError` for a request the server refuses."""
        url = f"{self.base_url}/{endpoint}"
        async with session.slots:
            try:
                # The SDK's generic POST (its documented way to any endpoint), the reply as
                # parsed JSON: the payloads are JSON already, and `create()` would walk each
                # through the SDK's parameter transforms, and building its typed reply would
                # walk the reply, which together cost more CPU than the old client's request.
                reply = await session.client.post(f"/{endpoint}", body=payload, cast_to=object,
                                                  options={"headers": self._headers})
            except openai.APIStatusError as error:
                if error.status_code in _RETRIED_STATUSES or error.status_code >= 500:
                    raise self._unavailable(url, f"HTTP {error.status_code} "
                                            f"({str(error.body)[:200]!r})") from None
                raise SieveragError(self._rejection(url, error)) from None
            except openai.APITimeoutError:
                raise self._unavailable(
                    url, f"no reply within timeout_s={self.timeout_s}") from None
            except openai.APIConnectionError as error:
                cause = error.__cause__ or error
                raise self._unavailable(url, f"{type(cause).__name__}: {cause}") from None
            except ValueError as error:  # the SDK parses the body as JSON; retrying cannot
                raise self._not_json(url, str(error)) from None
        if not isinstance(reply, dict):  # the SDK returns a body it was not told is JSON as text
            raise self._not_json(url, f"{str(reply)[:100]!r}")
        return reply

    def _not_json(self, url: str, detail: str) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"the LLM server at {url} sent a reply that is not valid JSON ({detail}); is "
            "base_url the server's OpenAI-compatible base URL (ending in /v1)?")

    def _unavailable(self, url: str, failure: str) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"the LLM server at {url} failed {self.max_retries + 1} attempt(s), last "
            f"with {failure}; is the server running? start it with `sieverag serve ...` (or "
            "`vllm serve`), or point base_url at a running one")

    def _rejection(self, url: str, error: openai.APIStatusError) -> str:
        """The message for a 4xx reply that retrying cannot fix."""
        body = error.body  # the SDK's: the body's "error" object, or the body itself
        message: Any = body.get("message", body) if isinstance(body, dict) else body
        if not message:
            message = error.response.text[:300]
        hint = {401: "check the key in api_key_env", 403: "check the key in api_key_env",
                404: f"check base_url and that the server serves model {self.model!r}"}
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
