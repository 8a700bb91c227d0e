"""OpenTelemetry spans of each request the embedded server answers: what the filter cut, by
which rule, and what that saved, in the trace of the request that asked.

Off unless asked for, by OpenTelemetry's own convention: `tracer_provider_from_env` builds a
tracer provider exporting OTLP over HTTP (`opentelemetry-sdk` and
`opentelemetry-exporter-otlp-proto-http`, the `otel` extra) when `OTEL_EXPORTER_OTLP_ENDPOINT`
(or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, and None otherwise; without it nothing here
imports OpenTelemetry and every `span` is a no-op. The SDK reads its other variables itself
(`OTEL_SERVICE_NAME`, default "sieverag"; `OTEL_EXPORTER_OTLP_HEADERS`, ...).

The app's tracing middleware (`api/middleware/request_tracing.py`) opens each request's route span
and makes its tracer the request's (`traced_by`, a context variable, so it follows the
request into the worker threads that run the filter); `span` opens a child of whatever span
is current, with that tracer. The spans of one request:

    POST /v1/rerank                      the route (SERVER), http.* attributes
      sieverag.filter                    documents, sentences in and kept, the bar's rule
                                         and reason, the filter's tokens (gen_ai.usage.*)
        sieverag.filter.windows          the windows planned: long documents, windows read
        sieverag.filter.chunk_stage      chunks read, scored by the filter or by the priors
          sieverag.filter.chunk_scores   the filter's call on the chunks (where it reads them)
          sieverag.filter.bar            the rule that set the bar, why, and the bar
        sieverag.filter.sentence_stage   sentences in and kept
        sieverag.context_budget          a token budget: the tokens it allowed and used
      chat {model}                       the proxy's forward to the generator (CLIENT; GenAI
                                         conventions: gen_ai.operation.name "chat", ...)
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

from sieverag.inference.core.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
PROTOCOL_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
SERVICE_NAME = "sieverag"
TRACER_NAME = "sieverag.serving"

# The tracer of the request being answered (None: not traced), set by the middleware.
_TRACER: ContextVar[Tracer | None] = ContextVar("sieverag_tracer", default=None)


def tracer_provider_from_env(environ: Mapping[str, str] | None = None
                             ) -> TracerProvider | None:
    """A tracer provider exporting each span by OTLP over HTTP (protobuf) to the endpoint
    OpenTelemetry's variables name, in batches; None when neither `OTEL_EXPORTER_OTLP_ENDPOINT`
    nor `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set. Refused (ConfigError) when one is set
    but the `otel` extra is not installed, or a protocol other than http/protobuf is asked."""
    environ = os.environ if environ is None else environ
    endpoint = environ.get(TRACES_ENDPOINT_ENV) or environ.get(ENDPOINT_ENV)
    if not endpoint:
        return None
    for name in PROTOCOL_ENVS:
        protocol = environ.get(name)
        if protocol and protocol != "http/protobuf":
            raise ConfigError(f"{name}={protocol}: sieverag exports its spans by OTLP over "
                              "HTTP only; set it to http/protobuf or unset it")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ConfigError(f"{ENDPOINT_ENV} is set ({endpoint}), but OpenTelemetry's SDK is not "
                          f"installed ({exc.name} is missing): pip install 'sieverag[otel]', "
                          "or unset it to serve without traces") from None
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def tracer_of(provider: TracerProvider) -> Tracer:
    """The server's tracer from `provider`, named for the serving package."""
    from sieverag import __version__

    return provider.get_tracer(TRACER_NAME, __version__)


def traced_by(tracer: Tracer | None) -> Token:
    """Make `tracer` the current request's (None: untraced); give the token back to
    `untraced` when the request ends."""
    return _TRACER.set(tracer)


def untraced(token: Token) -> None:
    _TRACER.reset(token)


def active() -> bool:
    """Whether the current request is traced (worth computing attributes for)."""
    return _TRACER.get() is not None


class _NoSpan:
    """What `span` yields when the request is not traced: attributes set on it go nowhere."""

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        return None


NO_SPAN = _NoSpan()


@contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None, *, client: bool = False
         ) -> Iterator[Span | _NoSpan]:
    """A span named `name`, the current span's child and current inside the block (an
    exception raised in it is recorded and sets its status to error); `client`: a call to
    another server (kind CLIENT; else INTERNAL). Untraced, a no-op span."""
    tracer = _TRACER.get()
    if tracer is None:
        yield NO_SPAN
        return
    from opentelemetry.trace import SpanKind

    kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
    with tracer.start_as_current_span(name, kind=kind, attributes=_valid(attributes)) as opened:
        yield opened


def current() -> Span | _NoSpan:
    """The current span, to add attributes to (untraced: a no-op span)."""
    if _TRACER.get() is None:
        return NO_SPAN
    from opentelemetry import trace

    return trace.get_current_span()


def record(target: Span | _NoSpan, attributes: Mapping[str, Any]) -> None:
    """Set `attributes` on `target`, those whose value is None left out (OpenTelemetry takes
    no null attribute)."""
    target.set_attributes(_valid(attributes) or {})


def failed(target: Span | _NoSpan, error_type: str) -> None:
    """Mark `target` as ended in an error of `error_type` (OpenTelemetry's `error.type`)."""
    if isinstance(target, _NoSpan):
        return
    from opentelemetry.trace import Status, StatusCode

    target.set_attribute("error.type", error_type)
    target.set_status(Status(StatusCode.ERROR, error_type))


def inject(headers: dict[str, str]) -> None:
    """Add the current span's context to `headers` (W3C `traceparent`), so a server they go
    to continues the trace; untraced, nothing."""
    if _TRACER.get() is None:
        return
    from opentelemetry import propagate

    propagate.inject(headers)


def _valid(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if attributes is None:
        return None
    return {key: value for key, value in attributes.items() if value is not None}
