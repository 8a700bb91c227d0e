"""An index held by `sieverag index serve`, searched over HTTP (`--retrieval.endpoint URL`).

The wire format is defined here, once, for both sides (the server in `serving/retrieval`
builds its bodies with `hit_payload` and `index_payload`):

* `GET /v1/index` → `{"fingerprint", "chunk_count", "source_count", "modes", "default_mode",
  "search": {"alpha", "rrf_k", "candidates"}, "max_queries", "max_k"}`;
* `POST /v1/search` `{"queries": [...], "k": 10, "mode": "hybrid"}` →
  `{"results": [[{"id", "source_id", "title", "text", "score"}, ...], ...]}`, one ranking per
  query, best first.

Rankings equal the served index's own: the server fuses with its search settings, so a
client whose fusion settings (`alpha`, `rrf_k`, `candidates`) differ is refused at start
rather than silently given the server's. A reranker runs here, on the served hits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from sieverag.inference.core.errors import BackendUnavailableError, ConfigError
from sieverag.inference.core.types import Document
from sieverag.inference.retrieval.config import SearchConfig
from sieverag.inference.retrieval.rerank import HitReranker
from sieverag.inference.retrieval.retrieved import RetrievedDocument
from sieverag.inference.retrieval.search_backend import (
    DEFAULT_TIMEOUT_S,
    check_search,
    fetch_depth,
    reranked,
)

INDEX_ROUTE = "/v1/index"
SEARCH_ROUTE = "/v1/search"
# The search settings a served index fuses with, which a client must share.
FUSION_SETTINGS = ("alpha", "rrf_k", "candidates")


@dataclass(frozen=True)
class ServedManifest:
    """What a served index tells of its chunks (`backend.IndexIdentity`)."""

    fingerprint: str
    chunk_count: int
    source_count: int


def hit_payload(hit: RetrievedDocument) -> dict[str, Any]:
    """One hit as `POST /v1/search` sends it."""
    document = hit.document
    return {"id": document.id, "source_id": hit.source_id, "title": document.title,
            "text": document.text, "score": hit.score}


def hit_from_payload(payload: dict[str, Any]) -> RetrievedDocument:
    """A hit as the server sent it, back into the in-process type."""
    document = Document(id=str(payload["id"]), text=str(payload["text"]),
                        title=str(payload.get("title") or ""))
    return RetrievedDocument(document, float(payload["score"]), str(payload["source_id"]))


def index_payload(manifest: Any, modes: Sequence[str], default_mode: str,
                  search_config: SearchConfig, max_queries: int, max_k: int) -> dict[str, Any]:
    """The body of `GET /v1/index` for a served index."""
    return {"fingerprint": manifest.fingerprint, "chunk_count": manifest.chunk_count,
            "source_count": manifest.source_count, "modes": list(modes),
            "default_mode": default_mode,
            "search": {name: getattr(search_config, name) for name in FUSION_SETTINGS},
            "max_queries": max_queries, "max_k": max_k}


class RemoteIndex:
    """A `SearchBackend` on `sieverag index serve` at `endpoint` (http://host:port)."""

    def __init__(self, endpoint: str, *, search_config: SearchConfig | None = None,
                 api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.search_config = search_config if search_config is not None else SearchConfig()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.endpoint, headers=headers, timeout=timeout,
                                    transport=transport)
        info = self._call("GET", INDEX_ROUTE)
        try:
            self.manifest = ServedManifest(str(info["fingerprint"]), int(info["chunk_count"]),
                                           int(info["source_count"]))
            self._modes = tuple(str(m) for m in info["modes"])
            self.max_queries = int(info["max_queries"])
            self.max_k = int(info["max_k"])
            served = {name: info["search"][name] for name in FUSION_SETTINGS}
        except (KeyError, TypeError, ValueError) as error:
            raise BackendUnavailableError(
                f"{self.endpoint}{INDEX_ROUTE} did not describe an index ({error!r}): is "
                "retrieval.endpoint a `sieverag index serve` server?") from None
        wanted = {name: getattr(self.search_config, name) for name in FUSION_SETTINGS}
        differ = [f"{name} {served[name]} (here {wanted[name]})" for name in FUSION_SETTINGS
                  if served[name] != wanted[name]]
        if differ:
            raise ConfigError(
                f"the index server {self.endpoint} fuses with {', '.join(differ)}: start it with "
                "the same --search.* settings, or set retrieval.search to the server's")

    @property
    def modes(self) -> tuple[str, ...]:
        """The search modes the served index supports."""
        return self._modes

    def close(self) -> None:
        self._client.close()

    def search(self, query: str, k: int = 10, mode: str = "hybrid",
               reranker: HitReranker | None = None) -> list[RetrievedDocument]:
        """The top-k chunks for `query`, best first."""
        return self.search_many([query], k, mode, reranker)[0]

    def search_many(self, queries: Sequence[str], k: int = 10, mode: str = "hybrid",
                    reranker: HitReranker | None = None) -> list[list[RetrievedDocument]]:
        """`search` for each query, sent in batches of the server's `max_queries`."""
        check_search(f"the index served at {self.endpoint}", self._modes, mode, k)
        fetch = fetch_depth(k, reranker, self.search_config)
        if fetch > self.max_k:
            raise ConfigError(f"the index server {self.endpoint} returns at most {self.max_k} "
                              f"hits a query (its --max-k), {fetch} asked")
        hits: list[list[RetrievedDocument]] = []
        for start in range(0, len(queries), self.max_queries):
            batch = list(queries[start:start + self.max_queries])
            body = self._call("POST", SEARCH_ROUTE, {"queries": batch, "k": fetch, "mode": mode})
            try:
                hits.extend([hit_from_payload(h) for h in ranking] for ranking in body["results"])
            except (KeyError, TypeError, ValueError) as error:
                raise BackendUnavailableError(f"{self.endpoint}{SEARCH_ROUTE} sent a malformed "
                                              f"answer ({error!r})") from None
        if len(hits) != len(queries):
            raise BackendUnavailableError(f"{self.endpoint}{SEARCH_ROUTE} answered {len(hits)} "
                                          f"rankings for {len(queries)} queries")
        return reranked(queries, hits, k, reranker)

    def _call(self, method: str, route: str, body: dict | None = None) -> Any:
        url = f"{self.endpoint}{route}"
        try:
            response = self._client.request(method, route, json=body)
        except httpx.HTTPError as error:
            raise BackendUnavailableError(
                f"the index server {url} cannot be reached ({type(error).__name__}: {error}): "
                "start it with `sieverag index serve INDEX --port P`, or check "
                "retrieval.endpoint") from None
        if response.status_code != 200:
            raise BackendUnavailableError(f"the index server {url} refused the request "
                                          f"({response.status_code}): {_message(response)}")
        try:
            return response.json()
        except ValueError:
            raise BackendUnavailableError(f"the index server {url} did not answer JSON: is "
                                          "retrieval.endpoint a `sieverag index serve` "
                                          "server?") from None


def _message(response: httpx.Response) -> str:
    """The error message of a refusal (an OpenAI-style error body), else its text."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]
