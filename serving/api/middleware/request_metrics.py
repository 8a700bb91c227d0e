"""Every HTTP request counted once in the server's metrics: its route, its status and its
time until the last byte of its response (a stream's too).

It runs outermost, so the requests the other middleware refuse (401 without the key, 413
over the size limit, 429 past the concurrency limit, 503 while draining) are counted as
well. A request's route is its path where one of the app's routes matches it (the server's
paths hold no parameters), any other path counts as "other", so a client cannot grow the
label set. A request whose client went away before its answer counts
as status 499; one whose app raised, as 500 (the server's error handler answers it so).
"""

from __future__ import annotations

import time

from starlette.routing import Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sieverag.serving.observability.metrics import CLIENT_GONE, ServerMetrics

OTHER_ROUTE = "other"


class RequestMetrics:
    """ASGI middleware: records each HTTP request in `metrics` (`ServerMetrics.record_request`)
    under its route: its path where a route of `router` matches it, else "other"."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics, router: Router) -> None:
        self.app = app
        self.metrics = metrics
        self.router = router
        self._routes: set[str] = set()  # the paths found to match, a route's each

    def route_of(self, scope: Scope) -> str:
        path = scope["path"]
        if path in self._routes:
            return path
        if any(route.matches(scope)[0] is not Match.NONE for route in self.router.routes):
            self._routes.add(path)
            return path
        return OTHER_ROUTE

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self.route_of(scope)
        started = time.monotonic()
        status = CLIENT_GONE
        complete = False

        async def send_noting_status(message: Message) -> None:
            nonlocal status, complete
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                complete = True
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        except Exception:
            status, complete = 500, True
            raise
        finally:
            self.metrics.record_request(route, status if complete else CLIENT_GONE,
                                        time.monotonic() - started)
