"""The embedded server's HTTP app, assembled: each endpoint's router (`api/`), the work each
route hands to (one class per endpoint, on one `ServingContext`), the middleware and the
error handlers.

Served with a `ProxyTarget` (`--proxy-to`), /v1/chat/completions is the filtering proxy
(`proxy`) instead of the chat endpoint: it forwards to another server, and generates nothing
here.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from sieverag.serving.api import health, models_route
from sieverag.serving.api.chat.router import router as chat_router
from sieverag.serving.api.chat.serving import Chat
from sieverag.serving.api.completions.router import router as completions_router
from sieverag.serving.api.completions.serving import Completions
from sieverag.serving.api.endpoint_base import ServingContext
from sieverag.serving.api.error_handlers import add_error_handlers
from sieverag.serving.api.health import Health
from sieverag.serving.api.metrics_route import router as metrics_router
from sieverag.serving.api.middleware.auth import BearerAuth
from sieverag.serving.api.middleware.body_limit import BodySizeLimit
from sieverag.serving.api.middleware.concurrency import Admission, AdmissionState
from sieverag.serving.api.middleware.disconnect import CancelOnDisconnect
from sieverag.serving.api.middleware.request_metrics import RequestMetrics
from sieverag.serving.api.middleware.request_tracing import TraceRequests
from sieverag.serving.api.models_route import ModelListing
from sieverag.serving.api.rerank.router import router as rerank_router
from sieverag.serving.api.rerank.serving import RerankServing
from sieverag.serving.api.score.router import router as score_router
from sieverag.serving.api.score.serving import Scorer
from sieverag.serving.config import LocalOptions
from sieverag.serving.engine.continuous_batching import BatchingEngine
from sieverag.serving.proxy.chat_proxy import ChatProxy, ProxyTarget
from sieverag.serving.proxy.router import router as proxy_router
from sieverag.serving.proxy.upstream import UpstreamClient

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider


def create_app(engine: BatchingEngine, options: LocalOptions, *, api_key: str | None = None,
               proxy: ProxyTarget | None = None,
               cards: Mapping[str, Mapping[str, Any]] | None = None,
               metrics_route: bool = True,
               tracer_provider: TracerProvider | None = None) -> FastAPI:
    """The FastAPI app serving `engine` (which the caller starts and closes), within the
    request limits of `options`; with `proxy`, its chat endpoint is the filtering proxy.
    `cards`: each served adapter's filter card, by served name (`ServingContext`).
    `app.state.metrics` holds its metrics (served at GET /metrics with `metrics_route`) and
    `app.state.admission` its concurrency limit and drain. With `tracer_provider`, each request
    is an OpenTelemetry trace (`observability.tracing`)."""
    context = ServingContext(engine, options, dict(cards or {}))
    admission = AdmissionState(options.max_concurrent_requests)
    context.metrics.watch_engine(engine.metrics, engine.queue_depth)
    context.metrics.watch_admission(lambda: admission.in_flight, admission.limit,
                                    lambda: admission.draining)
    upstream = UpstreamClient(proxy.upstream) if proxy is not None else None

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if upstream is None:
            yield
            return
        upstream.open()  # the proxy's connection pool lives on the server's event loop
        try:
            yield
        finally:
            await upstream.aclose()

    app = FastAPI(title="sieverag embedded server", docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=lifespan)
    app.state.metrics = context.metrics
    app.state.admission = admission
    app.state.health = Health(engine, admission)
    app.state.models = ModelListing(context)
    app.state.completions = Completions(context)
    app.state.reranker = RerankServing(context)
    app.state.scorer = Scorer(context)
    app.include_router(health.router)
    if metrics_route:
        app.include_router(metrics_router)
    app.include_router(models_route.router)
    app.include_router(completions_router)
    app.include_router(rerank_router)
    app.include_router(score_router)
    if proxy is None or upstream is None:
        app.state.chat = Chat(context)
        app.include_router(chat_router)
    else:
        app.state.chat_proxy = ChatProxy(context, proxy.filter_model, upstream,
                                         proxy.context_tokens)
        app.include_router(proxy_router)

    app.add_middleware(CancelOnDisconnect)  # innermost: it watches once the body is read
    app.add_middleware(BodySizeLimit, max_bytes=options.max_request_bytes)
    app.add_middleware(Admission, state=admission)  # 429 past the limit, 503 while draining
    if api_key is not None:  # added after, so it runs before: a client without the key gets 401
        app.add_middleware(BearerAuth, api_key=api_key)
    # Outermost: every request is counted, those the middleware above refuse too.
    app.add_middleware(RequestMetrics, metrics=context.metrics, router=app.router)
    if tracer_provider is not None:  # outside even that: a request's trace holds all of it
        app.add_middleware(TraceRequests, provider=tracer_provider)
    add_error_handlers(app)
    return app
