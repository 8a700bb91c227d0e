"""GET /health: 200 {"status": "ok"} while the engine's worker runs, 503 once it stopped. Open
without the API key (`middleware.auth`), as on vLLM."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from sieverag.serving.engine.batching import BatchingEngine


class Health:
    """The liveness of one engine."""

    def __init__(self, engine: BatchingEngine) -> None:
        self.engine = engine

    def response(self) -> JSONResponse:
        if not self.engine.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})


router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    checker: Health = request.app.state.health
    return checker.response()
