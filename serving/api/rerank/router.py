"""The rerank endpoints' routes: POST /v1/rerank (and /rerank, as on vLLM) and POST
/v2/rerank, each handed to the app's `RerankServing`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sieverag.serving.api.rerank.detection import RerankRequest
from sieverag.serving.api.rerank.dialects.cohere import RerankV2Request
from sieverag.serving.api.rerank.serving import RerankServing

router = APIRouter()


def reranker(request: Request) -> RerankServing:
    return request.app.state.reranker


@router.post("/v1/rerank")
@router.post("/rerank")
async def rerank(body: RerankRequest, request: Request) -> Response:
    return await reranker(request).rerank(body)


@router.post("/v2/rerank")
async def rerank_v2(body: RerankV2Request, request: Request) -> Response:
    return await reranker(request).rerank_v2(body)
