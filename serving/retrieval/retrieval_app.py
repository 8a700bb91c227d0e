"""The index server's FastAPI app: `/health`, `GET /v1/index`, `POST /v1/search` and
Search-R1's `POST /retrieve`, behind the same API key, body limit and error bodies as
`sieverag serve` (`serving/api`)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.retrieval.remote import (
    INDEX_ROUTE,
    SEARCH_ROUTE,
    hit_payload,
    index_payload,
)
from sieverag.inference.retrieval.retrieved import RetrievedDocument
from sieverag.inference.retrieval.search_backend import SearchBackend
from sieverag.serving.api.error_handlers import add_error_handlers
from sieverag.serving.api.field_policy import ignored_header, unknown_fields
from sieverag.serving.api.middleware.auth import BearerAuth
from sieverag.serving.api.middleware.body_limit import BodySizeLimit
from sieverag.serving.refusals import APIError
from sieverag.serving.retrieval.config import RetrievalServerConfig
from sieverag.serving.retrieval.search_protocol import (
    RetrieveRequest,
    SearchRequest,
    search_r1_result,
)


def default_mode(index: SearchBackend, wanted: str | None) -> str:
    """The mode of /retrieve: `wanted`, else hybrid where the index has it, else its first."""
    if wanted is not None:
        if wanted not in index.modes:
            raise ConfigError(f"--mode {wanted}: the index supports {', '.join(index.modes)}")
        return wanted
    return "hybrid" if "hybrid" in index.modes else index.modes[0]


class Searcher:
    """Runs the searches of every request on one index, one batch at a time (the index's
    retrieval cache and encoder are shared), checking each request against the limits."""

    def __init__(self, index: SearchBackend, config: RetrievalServerConfig) -> None:
        self.index = index
        self.config = config
        self.mode = default_mode(index, config.mode)
        self._lock = threading.Lock()

    def search(self, queries: Sequence[str], k: int, mode: str) -> list[list[RetrievedDocument]]:
        if len(queries) > self.config.max_queries:
            raise APIError(400, f"queries holds {len(queries)} queries, this server takes at "
                                f"most {self.config.max_queries} a request (--max-queries): "
                                "send them in several requests", param="queries")
        if k > self.config.max_k:
            raise APIError(400, f"at most {self.config.max_k} hits a query (--max-k), {k} asked",
                           param="k")
        if mode not in self.index.modes:
            raise APIError(400, f"mode {mode!r}: this index supports "
                                f"{', '.join(self.index.modes)}", param="mode")
        with self._lock:
            return self.index.search_many(list(queries), k, mode)


router = APIRouter()


@router.get("/health")
def health() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get(INDEX_ROUTE)
def describe(request: Request) -> JSONResponse:
    searcher: Searcher = request.app.state.searcher
    config = searcher.config
    return JSONResponse(index_payload(searcher.index.manifest, searcher.index.modes,
                                      searcher.mode, config.search, config.max_queries,
                                      config.max_k))


@router.post(SEARCH_ROUTE)
def search(body: SearchRequest, request: Request) -> JSONResponse:
    searcher: Searcher = request.app.state.searcher
    rankings = searcher.search(body.queries, body.k, body.mode)
    return JSONResponse({"results": [[hit_payload(h) for h in r] for r in rankings]},
                        headers=ignored_header(unknown_fields(body)))


@router.post("/retrieve")
def retrieve(body: RetrieveRequest, request: Request) -> JSONResponse:
    searcher: Searcher = request.app.state.searcher
    k = body.topk if body.topk is not None else searcher.config.topk
    rankings = searcher.search(body.queries, k, searcher.mode)
    return JSONResponse(search_r1_result(rankings, body.return_scores),
                        headers=ignored_header(unknown_fields(body)))


def create_retrieval_app(index: SearchBackend, config: RetrievalServerConfig, *,
                         api_key: str | None = None) -> FastAPI:
    """The app serving `index` within `config`'s limits; with `api_key`, every route but
    /health needs `Authorization: Bearer <api_key>`."""
    app = FastAPI(title="sieverag index server", docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.searcher = Searcher(index, config)
    app.include_router(router)
    app.add_middleware(BodySizeLimit, max_bytes=config.max_request_bytes,
                       flag="--max-request-bytes", what="queries")
    if api_key is not None:
        app.add_middleware(BearerAuth, api_key=api_key)  # outermost: before the body is read
    add_error_handlers(app)
    return app
