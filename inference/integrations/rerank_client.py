"""A client of the rerank endpoint (`POST {base_url}/rerank`, the embedded server's
`/v1/rerank`) that returns the documents to keep, best first, and the settings the framework
adapters (`langchain`, `llamaindex`) share; with `filter` set they run the filter in process
instead (`in_process.InProcessFilter`), with the same selection.

The server runs the trained filter (MCF) on the documents and answers in the Cohere/Jina
schema with sieverag's `kept` verdicts (README, "Reranking with the filter"); each result is
read as a `RerankResult` (inference/core/types.py), the shape the server writes. Which results a
caller gets (`keep`, `top_n`) is `selection`'s, shared with the in-process filter;
`keep="top_n"` also works against any Cohere/Jina-schema reranker. `Keep`, `Granularity`,
`Ranker`, `check_selection` and `choose` are importable from here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, Field, ValidationError

from sieverag.inference.core.errors import ConfigError, SieveragError, validation_problems
from sieverag.inference.core.types import RerankResult
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME
from sieverag.inference.integrations.selection import (
    Granularity,
    Keep,
    Ranker,
    check_selection,
    choose,
)
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL

# What each refused status most likely means for a caller of this client.
_ADVICE = {
    400: "check the documents (each must fit the model's context) and the settings",
    401: "pass the server's key as api_key",
    403: "pass the server's key as api_key",
    404: "check base_url (the server's /v1 address, e.g. http://127.0.0.1:8000/v1) and that "
         "the server serves the model",
}


class RerankEndpointError(SieveragError):
    """The rerank endpoint cannot be reached, refused the request, or sent a reply that is not
    a rerank response."""


@dataclass(frozen=True)
class RerankEndpoint:
    """Where the filter is served and which of its results to keep."""

    base_url: str = field(default="http://127.0.0.1:8000/v1", metadata={
        "help": "the server's OpenAI-style base URL; requests go to {base_url}/rerank"})
    model: str = field(default="filter", metadata={
        "help": "the served filter adapter (or model) name, as `sieverag serve --adapters` "
                "named it"})
    keep: Keep = field(default="kept", metadata={
        "help": "kept: the documents the server's bar keeps; top_n: the top_n best, kept or not"})
    top_n: int | None = field(default=None, metadata={
        "help": "at most this many documents, best first; None: no cap"})
    granularity: Granularity = field(default="chunk", metadata={
        "help": "sentence: also run the filter's sentence stage and pass on the text it "
                "keeps of each kept document (its pruned_text)"})
    timeout_s: float = field(default=120.0, metadata={"help": "seconds to wait for the reply"})
    api_key: str | None = field(default=None, repr=False, metadata={
        "help": "the server's API key (`sieverag serve --api-key-env`); None: send none"})

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url must start with http:// or https://, got "
                              f"{self.base_url!r}")
        if not self.model:
            raise ConfigError("model must name the served filter (e.g. 'filter'), got ''")
        check_selection(self.keep, self.top_n, self.granularity)
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, got {self.timeout_s}")

    @property
    def url(self) -> str:
        return f"{self.base_url.rstrip('/')}/rerank"

    def select(self, query: str, texts: Sequence[str]) -> list[RerankResult]:
        """The results to keep for `texts` (by their `index` there), best first; no request
        for no texts."""
        if not texts:
            return []
        try:
            response = httpx.post(self.url, json=self._body(query, texts),
                                  headers=self._headers(), timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        return self._selected(response, len(texts))

    async def aselect(self, query: str, texts: Sequence[str]) -> list[RerankResult]:
        """`select`, without blocking the event loop."""
        if not texts:
            return []
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                response = await client.post(self.url, json=self._body(query, texts),
                                             headers=self._headers())
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        return self._selected(response, len(texts))

    def _body(self, query: str, texts: Sequence[str]) -> dict[str, Any]:
        # Every result comes back (no top_n): `kept` documents may rank below the top_n. The
        # adapters pass on each document's pruned text, not its sentence spans.
        body = {"model": self.model, "query": query, "documents": list(texts),
                "return_documents": False, "granularity": self.granularity}
        return {**body, "return_spans": False} if self.granularity == "sentence" else body

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _unreachable(self, exc: httpx.HTTPError) -> RerankEndpointError:
        if isinstance(exc, httpx.TimeoutException):
            failure = f"no reply within timeout_s={self.timeout_s}"
        else:
            failure = f"{type(exc).__name__}: {exc}"
        return RerankEndpointError(
            f"cannot reach the rerank endpoint {self.url} ({failure}); is the server running? "
            "start it with `sieverag serve --engine local --adapters filter=smollm2-filter`, "
            "or point base_url at a running one")

    def _selected(self, response: httpx.Response, count: int) -> list[RerankResult]:
        if response.status_code >= 400:
            raise RerankEndpointError(
                f"the rerank endpoint {self.url} refused the request with HTTP "
                f"{response.status_code}: {_error_message(response)}; "
                f"{_ADVICE.get(response.status_code, 'check the server log')}")
        results = self._parse(response, count)
        if self.keep == "kept" and any(result.kept is None for result in results):
            raise RerankEndpointError(
                f"the reranker at {self.url} gives no `kept` verdicts (it is not "
                "sieverag's rerank endpoint); use keep='top_n' to keep the best top_n")
        return choose(results, self.keep, self.top_n)

    def _parse(self, response: httpx.Response, count: int) -> list[RerankResult]:
        """The reply's results in its order (best first), each checked."""
        try:
            results = [RerankResult.from_json(entry) for entry in response.json()["results"]]
        except ValidationError as exc:
            raise self._malformed(f"it is not a rerank response ({validation_problems(exc)})"
                                  ) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise self._malformed(f"it is not a rerank response ({type(exc).__name__}: "
                                  f"{exc})") from None
        indices = [result.index for result in results]
        if sorted(indices) != list(range(count)):
            raise self._malformed(f"its results hold the indices {indices} for {count} documents")
        if self.granularity == "sentence" and any(r.key_sentences is None for r in results):
            raise self._malformed("its results have no key_sentences at granularity 'sentence'")
        return results

    def _malformed(self, problem: str) -> RerankEndpointError:
        return RerankEndpointError(f"the rerank endpoint {self.url} sent a reply sieverag cannot "
                                   f"read: {problem}; point base_url at a sieverag server")


def _error_message(response: httpx.Response) -> str:
    """The server's own message: an OpenAI-style `error.message`, or the start of the body."""
    try:
        error = response.json().get("error")
        return str(error["message"] if isinstance(error, dict) else error or response.text[:300])
    except (ValueError, AttributeError, KeyError):
        return response.text[:300]


_DEFAULTS = RerankEndpoint()


class RerankSettings(BaseModel):
    """The framework adapters' settings, one set for both (pydantic fields, as LangChain's
    and LlamaIndex's components are pydantic models); `ranker` builds what they call. The
    server's key is not a field, so it is never shown or saved."""

    base_url: str = Field(_DEFAULTS.base_url, description="the server's base URL (…/v1)")
    model: str = Field(_DEFAULTS.model, description="the served filter's name")
    keep: Keep = Field(_DEFAULTS.keep, description="kept: the filter's verdicts; top_n: the "
                                                   "top_n best, kept or not")
    top_n: int | None = Field(_DEFAULTS.top_n, description="at most this many passages")
    granularity: Granularity = Field(_DEFAULTS.granularity, description="sentence: pass on "
                                     "the text the filter keeps of each passage")
    timeout_s: float = Field(_DEFAULTS.timeout_s, description="seconds to wait for the reply")
    filter: str | None = Field(None, description=(
        f"run the filter in this process instead of calling base_url: a filter name (e.g. "
        f"{DEFAULT_FILTER_NAME}) or adapter folder; None: call the endpoint"))
    base_model: str = Field(DEFAULT_MODEL, description="in process: the model the filter "
                                                       "was trained on (name or folder)")

    def ranker(self, api_key: str | None) -> Ranker:
        """The endpoint client, or with `filter` the filter loaded in this process."""
        if self.filter is None:
            return RerankEndpoint(base_url=self.base_url, model=self.model, keep=self.keep,
                                  top_n=self.top_n, granularity=self.granularity,
                                  timeout_s=self.timeout_s, api_key=api_key)
        # Imported here: it loads torch and transformers, which the endpoint client never needs
        # (no cycle: in_process imports `selection`, not this module).
        from sieverag.inference.integrations.in_process import InProcessFilter

        return InProcessFilter(self.filter, base_model=self.base_model, keep=self.keep,
                               top_n=self.top_n, granularity=self.granularity)
