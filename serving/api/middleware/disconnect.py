"""Work for a client that has gone away is cancelled, not finished.

uvicorn does not cancel a request's handler when its client disconnects: for a plain (not
streaming) response it only answers `http.disconnect` to the app's next `receive()`, which a
handler that has read its body never calls. So `CancelOnDisconnect` runs the app for each
request in a task of its own and, once the body is read, waits on `receive()` beside it; when
the client goes away before the response is complete, it cancels that task. Whatever the
handler awaits then raises `CancelledError`: a tokenising thread's result is dropped (nothing
is submitted after it), and the engine futures it waits on are cancelled, so their sequences
leave the engine's queue or running batch before its next forward pass.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)


class CancelOnDisconnect:
    """ASGI middleware: cancels an HTTP request's app task when its client disconnects after
    sending the whole body and before the response is complete."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_read = asyncio.Event()
        answered = False

        async def receive_noting_the_end() -> Message:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_read.set()
            return message

        async def send_noting_the_end(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True
            await send(message)

        handler = asyncio.create_task(self.app(scope, receive_noting_the_end,
                                               send_noting_the_end))
        watcher = asyncio.create_task(_client_gone(receive, body_read))
        try:
            await asyncio.wait((handler, watcher), return_when=asyncio.FIRST_COMPLETED)
            # After a complete response the server answers `http.disconnect` too: not a loss.
            if not handler.done() and not answered:
                logger.info("%s %s: the client disconnected before its response; its work is "
                            "cancelled", scope["method"], scope["path"])
                handler.cancel()
                await asyncio.wait((handler,))
                if handler.cancelled():
                    return  # nobody to answer: the server drops whatever is sent now
            await handler  # its result, or the error it raised
        finally:
            watcher.cancel()
            handler.cancel()  # this middleware itself cancelled (shutdown): so is the handler


async def _client_gone(receive: Receive, body_read: asyncio.Event) -> None:
    """Returns when `receive` reports the client gone, asked only once the body is read (the
    app reads it; afterwards the server has nothing but `http.disconnect` to report)."""
    await body_read.wait()
    while (await receive())["type"] != "http.disconnect":
        pass
