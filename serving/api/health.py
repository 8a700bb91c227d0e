"""GET /health: 200 {"status": "ok"} while the engine's worker runs and the server admits
requests; 503 once the engine stopped, or once the server drains (SIGTERM), so that a load
balancer sends new requests elsewhere. Open without the API key (`middleware.auth`), as on
vLLM."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from sieverag.serving.api.middleware.concurrency import AdmissionState
from sieverag.serving.engine.continuous_batching import BatchingEngine


class Health:
    """The liveness of one engine, and whether its server still admits requests."""

    def __init__(self, engine: BatchingEngine, admission: AdmissionState) -> None:
        self.engine = engine
        self.admission = admission

    def response(self) -> JSONResponse:
        if not self.engine.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        if self.admission.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok"})


router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    checker: Health = request.app.state.health
    return checker.response()
