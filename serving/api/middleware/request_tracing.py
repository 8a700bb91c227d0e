"""Each HTTP request as an OpenTelemetry trace (`serving/observability/tracing.py`): ASGI
middleware that opens the request's route span, a SERVER span named `{method} {route}`
(HTTP's semantic conventions: `http.request.method`, `url.path`, `http.route`,
`http.response.status_code`; a 5xx answer sets its status to error), continuing the trace a
client's `traceparent` header names, and makes the server's tracer the request's, so the
filter's and the proxy's spans are its children. Outermost, so a request refused before
routing (401, 413, 429) is traced too."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sieverag.serving.observability import tracing

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider


class TraceRequests:
    """ASGI middleware: every HTTP request a route span, traced by `provider`'s tracer."""

    def __init__(self, app: ASGIApp, provider: TracerProvider) -> None:
        self.app = app
        self.tracer = tracing.tracer_of(provider)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind, Status, StatusCode

        carrier = {name.decode("latin-1"): value.decode("latin-1")
                   for name, value in scope["headers"]}
        method = scope["method"]
        with self.tracer.start_as_current_span(
                method, context=propagate.extract(carrier), kind=SpanKind.SERVER,
                attributes={"http.request.method": method, "url.path": scope["path"],
                            "url.scheme": scope.get("scheme", "http")}) as route_span:

            async def send_traced(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = message["status"]
                    route_span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        route_span.set_status(Status(StatusCode.ERROR))
                        route_span.set_attribute("error.type", str(status))
                await send(message)

            token = tracing.traced_by(self.tracer)
            try:
                await self.app(scope, receive, send_traced)
            finally:
                tracing.untraced(token)
                route = getattr(scope.get("route"), "path", None)
                if route is not None:  # known once the router matched the request
                    route_span.set_attribute("http.route", route)
                    route_span.update_name(f"{method} {route}")
