"""The request body size limit: a body over `max_request_bytes` gets a 413 with an OpenAI-style
error body (code `request_too_large`), before the server reads more of it than the limit.

FastAPI's own `max_body_size` is not used: when a request declares a Content-Length over the
limit, it replaces whatever the app answers with a plain-text 413, which OpenAI clients
cannot read as an error.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sieverag.serving.refusals import error_body


class RequestTooLarge(HTTPException):
    """A request body found over the limit while it is read. An `HTTPException`, so FastAPI
    hands it to the app's exception handlers rather than calling it a body it cannot parse."""

    def __init__(self, max_bytes: int, flag: str = "--local.max-request-bytes",
                 what: str = "prompts") -> None:
        super().__init__(413, f"the request body is larger than this server's limit of "
                              f"{max_bytes} bytes ({flag}): send fewer or shorter {what}")

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.detail, "invalid_request_error",
                                       code="request_too_large"), status_code=413)


class BodySizeLimit:
    """ASGI middleware: a request whose Content-Length is over `max_bytes` is answered 413 at
    once, its body unread; a body without one (chunked) raises `RequestTooLarge` from
    `receive` as soon as the bytes received pass `max_bytes`. The message names `flag`, the
    server's setting of the limit, and the `what` a client sends fewer of."""

    def __init__(self, app: ASGIApp, max_bytes: int, flag: str = "--local.max-request-bytes",
                 what: str = "prompts") -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.flag = flag
        self.what = what

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _declared_length(scope) > self.max_bytes:
            refusal = RequestTooLarge(self.max_bytes, self.flag, self.what)
            await refusal.response()(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise RequestTooLarge(self.max_bytes, self.flag, self.what)
            return message

        await self.app(scope, receive_within_limit, send)


def _declared_length(scope: Scope) -> int:
    """The request's Content-Length; 0 without one (the server's HTTP parser has already
    refused a malformed one)."""
    value = Headers(scope=scope).get("content-length", "0")
    return int(value) if value.isdigit() else 0
