"""POST /v1/completions' route, handed to the app's `Completions`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sieverag.serving.api.completions.protocol import CompletionRequest

router = APIRouter()


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    return await request.app.state.completions.create(body)
