"""Infinity's rerank dialect: Cohere v1's body with `raw_scores` (Infinity's client sends it,
which is how the server tells it from Cohere's), answered as Cohere's with `object: "rerank"`
and each document, when asked for, the string."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from sieverag.serving.api.bodies import SparseBody
from sieverag.serving.api.rerank.protocol import (
    FilterFields,
    RawScores,
    RerankUsage,
    RerankV1Body,
    rerank_id,
)
from sieverag.serving.api.rerank.query import Ranking, RankingQuery
from sieverag.serving.request_limits import DocumentRefusal


class InfinityRequest(RawScores, RerankV1Body):
    """Infinity's /v1/rerank body."""


class InfinityResult(FilterFields):
    """One result of Infinity's answer: its document, when asked for, is the string."""

    index: int
    relevance_score: float
    document: str | None = None


class InfinityRerankResponse(SparseBody):
    """POST /v1/rerank in Infinity's dialect."""

    id: str
    object: Literal["rerank"] = "rerank"
    model: str
    usage: RerankUsage
    results: list[InfinityResult]


def ranking_query(body: InfinityRequest) -> RankingQuery:
    """Infinity's request as the filter's query: Cohere's, with its score scale."""
    refusal = DocumentRefusal("documents", "send max_tokens_per_doc to cut it")
    return replace(body.ranking_query(body.documents, refusal), raw_scores=body.raw_scores)


def answer(ranking: Ranking, query: RankingQuery) -> InfinityRerankResponse:
    """Infinity's answer: the Cohere body, best first, each document the string."""
    return InfinityRerankResponse(
        id=rerank_id(), model=ranking.model,
        usage=RerankUsage(total_tokens=ranking.total_tokens), results=[
            InfinityResult(index=r.index, relevance_score=r.relevance_score,
                           document=ranking.texts[r.index] if query.return_documents else None,
                           **FilterFields.of(r))
            for r in ranking.best(query.top_n)])
