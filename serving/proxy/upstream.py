"""Forwarding a chat request to the upstream generator (`--proxy-to`), and answering with
what it answered, whatever happens to it.

* The upstream's answer, any status, goes back as it came: status, body and its end-to-end
  headers (hop-by-hop ones and the body's length and encoding are the proxy's own).
* The upstream unreachable, or failing mid-answer: 502 (`upstream_unreachable`) naming the
  URL and the connection's error.
* No complete answer within `timeout_s`: 504 (`upstream_timeout`). A plain request's whole
  answer must arrive within it; a stream must start within it, then each chunk must follow
  the last within it. A stream that breaks once under way cannot change its status: it ends
  with an SSE event `data: {"error": {...}}`, which OpenAI clients raise as an error.

Request headers go upstream end to end as the client sent them, except `Authorization`:
the upstream's own key (`--proxy-api-key-env`) when there is one, else the client's header
only when the proxy takes no key of its own (a proxy key never leaves the proxy).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import httpx
from starlette.responses import JSONResponse, Response, StreamingResponse

from sieverag.serving.api.streaming import error_event
from sieverag.serving.refusals import error_body

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Headers that belong to one connection, or describe the body as the proxy re-sends it.
_NOT_FORWARDED = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length", "content-encoding",
    "accept-encoding", "authorization", "date", "server"})


@dataclass(frozen=True)
class Upstream:
    """Where the proxy forwards chat requests, and with what."""

    base_url: str  # the OpenAI base URL, e.g. http://127.0.0.1:8001/v1
    model: str | None  # the `model` every forwarded request names; None: the client's
    timeout_s: float
    api_key: str | None  # the upstream's own key
    forward_client_key: bool  # the client's Authorization header goes upstream

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


class UpstreamError(Exception):
    """The upstream gave no answer: unreachable (502) or too slow (504)."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    def body(self) -> dict:
        return error_body(str(self), "server_error", code=self.code)

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


class UpstreamClient:
    """One HTTP connection pool to the upstream; `open()` and `aclose()` on the server's
    event loop (the app's lifespan)."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self._client: httpx.AsyncClient | None = None

    def open(self) -> None:
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.upstream.timeout_s),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def headers(self, client_headers: Mapping[str, str]) -> dict[str, str]:
        """The request headers to send upstream (see the module's docstring)."""
        headers = {name: value for name, value in client_headers.items()
                   if name.lower() not in _NOT_FORWARDED}
        headers["accept-encoding"] = "identity"  # a stream is relayed as it comes, unpacked
        if self.upstream.api_key is not None:
            headers["authorization"] = f"Bearer {self.upstream.api_key}"
        elif self.upstream.forward_client_key and "authorization" in client_headers:
            headers["authorization"] = client_headers["authorization"]
        return headers

    async def post(self, content: bytes, client_headers: Mapping[str, str]
                   ) -> tuple[int, dict[str, str], bytes]:
        """POST `content` to the chat URL; the answer's status, headers and whole body, all
        within the timeout. Raises `UpstreamError`."""
        async def exchange() -> tuple[int, dict[str, str], bytes]:
            response = await self._send(content, client_headers)
            try:
                return response.status_code, _answer_headers(response), await response.aread()
            finally:
                await response.aclose()

        try:
            return await asyncio.wait_for(self._guarded(exchange()), self.upstream.timeout_s)
        except asyncio.TimeoutError:
            raise self._timeout() from None

    async def stream(self, content: bytes, client_headers: Mapping[str, str],
                     extra_headers: Mapping[str, str]) -> Response:
        """POST `content` asking for a stream; an answer that starts within the timeout is
        relayed chunk by chunk (`extra_headers` added), any other answer returned whole.
        Raises `UpstreamError` when none starts."""
        try:
            response = await asyncio.wait_for(
                self._guarded(self._send(content, client_headers)), self.upstream.timeout_s)
        except asyncio.TimeoutError:
            raise self._timeout() from None
        headers = {**_answer_headers(response), **extra_headers}
        if response.status_code >= 400:  # an error is one JSON body, not a stream
            try:
                body = await asyncio.wait_for(self._guarded(response.aread()),
                                              self.upstream.timeout_s)
            except asyncio.TimeoutError:
                raise self._timeout() from None
            finally:
                await response.aclose()
            return Response(body, status_code=response.status_code, headers=headers)
        return StreamingResponse(self._relay(response), status_code=response.status_code,
                                 headers=headers)

    async def _relay(self, response: httpx.Response) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():  # each read within httpx's read timeout
                yield chunk
        except httpx.TimeoutException:
            logger.warning("the upstream stream from %s stalled for over %s s; ended with an "
                           "error event", self.upstream.chat_url, self.upstream.timeout_s)
            yield error_event(self._timeout().body())
        except httpx.HTTPError as exc:
            logger.warning("the upstream stream from %s broke: %r; ended with an error event",
                           self.upstream.chat_url, exc)
            yield error_event(self._unreachable(exc).body())
        finally:
            await response.aclose()

    async def _send(self, content: bytes, client_headers: Mapping[str, str]) -> httpx.Response:
        if self._client is None:
            raise RuntimeError("UpstreamClient.open() was not called")
        request = self._client.build_request("POST", self.upstream.chat_url, content=content,
                                             headers=self.headers(client_headers))
        return await self._client.send(request, stream=True)

    async def _guarded(self, work: Awaitable[T]) -> T:
        """`work`'s result, httpx's failures turned into `UpstreamError`s."""
        try:
            return await work
        except httpx.TimeoutException:
            raise self._timeout() from None
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc

    def _timeout(self) -> UpstreamError:
        return UpstreamError(504, f"the upstream {self.upstream.chat_url} did not answer within "
                             f"{self.upstream.timeout_s:g} s (--proxy-timeout)",
                             "upstream_timeout")

    def _unreachable(self, exc: Exception) -> UpstreamError:
        detail = str(exc) or type(exc).__name__
        return UpstreamError(502, f"the upstream {self.upstream.chat_url} failed: {detail}; is "
                             "it running, and is --proxy-to its OpenAI base URL?",
                             "upstream_unreachable")


def _answer_headers(response: httpx.Response) -> dict[str, str]:
    return {name: value for name, value in response.headers.items()
            if name.lower() not in _NOT_FORWARDED}


