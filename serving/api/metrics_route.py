"""GET /metrics: the server's Prometheus metrics (`observability.metrics`) in Prometheus's text
format, under the same API-key rule as /v1 (`middleware.auth`); never refused for load.
With `--metrics-port`, they are served on that port instead, and this route is absent."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from sieverag.serving.observability.metrics import ServerMetrics

router = APIRouter()


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    served: ServerMetrics = request.app.state.metrics
    # Off the event loop: the queue depth is read under the engine's lock.
    content = await asyncio.to_thread(served.exposition)
    return Response(content, media_type=CONTENT_TYPE_LATEST)
