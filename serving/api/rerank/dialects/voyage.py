"""Voyage's rerank dialect, told by `top_k` or `truncation`: `top_k` (or `top_n`),
`truncation` (null: true, as Voyage does) and `return_documents`; answered with
`{object: "list", data[{index, relevance_score, document?: str}], model, usage}`."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import Field, StrictInt

from sieverag.serving.api.bodies import SparseBody
from sieverag.serving.api.rerank.protocol import FilterFields, RerankUsage, RerankV1Body
from sieverag.serving.api.rerank.query import Ranking, RankingQuery
from sieverag.serving.request_limits import DocumentRefusal, Truncation


class VoyageRequest(RerankV1Body):
    """Voyage's /v1/rerank body."""

    top_k: StrictInt | None = Field(None, ge=0, description="Voyage: results returned, best "
                                    "first; null: every document")
    truncation: bool | None = Field(None, description="Voyage: cut a document longer than "
                                    "the filter's window to its first window (null: true, as "
                                    "Voyage does); false: read it window by window")


class VoyageResult(FilterFields):
    """One result of Voyage's answer: its document, when asked for, is the string."""

    index: int
    relevance_score: float
    document: str | None = None


class VoyageRerankResponse(SparseBody):
    """POST /v1/rerank in Voyage's dialect."""

    object: Literal["list"] = "list"
    data: list[VoyageResult]
    model: str
    usage: RerankUsage


def ranking_query(body: VoyageRequest) -> RankingQuery:
    """Voyage's request as the filter's query: `top_k` results, a long document cut to its
    first window unless `truncation` is false."""
    refusal = DocumentRefusal("documents", "send truncation: true to cut it")
    return replace(body.ranking_query(body.documents, refusal),
                   top_n=body.top_k if body.top_k is not None else body.top_n,
                   truncation=None if body.truncation is False else Truncation())


def answer(ranking: Ranking, query: RankingQuery) -> VoyageRerankResponse:
    """Voyage's answer: `data` best first, cut to `top_k`, each document the string."""
    return VoyageRerankResponse(
        model=ranking.model, usage=RerankUsage(total_tokens=ranking.total_tokens), data=[
            VoyageResult(index=r.index, relevance_score=r.relevance_score,
                         document=ranking.texts[r.index] if query.return_documents else None,
                         **FilterFields.of(r))
            for r in ranking.best(query.top_n)])
