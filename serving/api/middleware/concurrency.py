"""Admission: at most `--local.max-concurrent-requests` requests at once, and none while the
server drains.

As TEI's `--max-concurrent-requests` (default 512), a request past the limit is answered 429
at once, with `Retry-After`, rather than queued: the server's queue cannot grow without
bound, and a client (or a load balancer) retries later or elsewhere. A request holds its slot
until its response is complete, so a stream counts while it lasts. Once the server drains
(SIGTERM, `local_server`), every new request gets 503 and `/health` turns unhealthy, while
the requests in flight finish. `/health` and `/metrics` are never limited: a probe or a
scrape must get through a full server.
"""

from __future__ import annotations

import threading

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from sieverag.serving.refusals import error_body

# Paths answered whatever the load: the liveness probe and the metrics scrape.
UNLIMITED_PATHS = frozenset({"/health", "/metrics"})
# Seconds a refused client is told to wait (`Retry-After`): about one busy request's time.
RETRY_AFTER_S = 1


class AdmissionState:
    """The requests in flight against the limit, and whether the server drains; shared by the
    middleware, /health, /metrics and the server's drain. Safe from any thread."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._in_flight = 0
        self._draining = False
        self._lock = threading.Lock()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def draining(self) -> bool:
        return self._draining

    def drain(self) -> None:
        """Admit nothing more: new requests get 503."""
        self._draining = True

    def try_enter(self) -> bool:
        """Take a slot; False when all `limit` are held."""
        with self._lock:
            if self._in_flight >= self.limit:
                return False
            self._in_flight += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1


class Admission:
    """ASGI middleware: every HTTP request but `UNLIMITED_PATHS` takes one of the state's
    slots for as long as the app answers it; none free: 429 with `Retry-After`; draining:
    503."""

    def __init__(self, app: ASGIApp, state: AdmissionState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNLIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        state = self.state
        if state.draining:
            await _refuse(503, "the server is shutting down and takes no new requests: send "
                          "it to another replica", "shutting_down",
                          {"Connection": "close"}, scope, receive, send)
            return
        if not state.try_enter():
            await _refuse(429, f"the server is serving its limit of {state.limit} requests at "
                          "once (--local.max-concurrent-requests): retry after "
                          f"{RETRY_AFTER_S} s", "overloaded",
                          {"Retry-After": str(RETRY_AFTER_S)}, scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            state.leave()


async def _refuse(status: int, message: str, code: str, headers: dict[str, str],
                  scope: Scope, receive: Receive, send: Send) -> None:
    body = error_body(message, "server_error", code=code)
    await JSONResponse(body, status_code=status, headers=headers)(scope, receive, send)
