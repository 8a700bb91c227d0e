"""POST /v1/score (and /score, as on vLLM), handed to the app's `Scorer`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sieverag.serving.api.score.protocol import ScoreRequest
from sieverag.serving.api.score.serving import Scorer

router = APIRouter()


@router.post("/v1/score")
@router.post("/score")
async def score(body: ScoreRequest, request: Request) -> Response:
    scorer: Scorer = request.app.state.scorer
    return await scorer.score(body)
