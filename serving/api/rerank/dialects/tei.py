"""Hugging Face text-embeddings-inference's rerank dialect (TEI), told by `texts`: the
documents as `texts`, `truncate` (with `truncation_direction`), `raw_scores`, `return_text`,
and `top_n`, which LiteLLM sends it; answered with a bare array `[{index, score, text?}]`,
best first."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import Field, RootModel

from sieverag.serving.api.rerank.protocol import Documents, FilterFields, RawScores, RerankV1Body
from sieverag.serving.api.rerank.query import Ranking, RankingQuery
from sieverag.serving.request_limits import DocumentRefusal, Truncation


class TEIRequest(RawScores, RerankV1Body):
    """TEI's /rerank body."""

    texts: Documents | None = Field(None, description="TEI: the documents (instead of "
                                    "`documents`); the answer is TEI's bare array")
    return_text: bool = Field(False, description="TEI: return each document's text")
    truncate: bool = Field(False, description="TEI: cut a document longer than the "
                           "filter's window to its first (or, truncation_direction Left, last) "
                           "window, instead of reading it window by window")
    truncation_direction: Literal["Right", "Left", "right", "left"] = Field(
        "Right", description="TEI, with truncate: Right cuts the document's end, Left its "
                             "start")


class TEIResult(FilterFields):
    """One entry of TEI's answer: `score` (P(relevant), or with raw_scores its logit) and,
    with return_text, the document's `text`."""

    index: int
    score: float
    text: str | None = None


class TEIRerankResponse(RootModel[list[TEIResult]]):
    """POST /v1/rerank (or /rerank) in TEI's dialect: a bare array, best first."""


def ranking_query(body: TEIRequest) -> RankingQuery:
    """TEI's request as the filter's query: `truncate` cuts a long document to one window,
    at its end or (`truncation_direction` Left) its start; `return_text` (or Cohere's
    `return_documents`) asks for the texts back."""
    refusal = DocumentRefusal("texts", "send truncate: true to cut it")
    keep = "end" if body.truncation_direction.lower() == "left" else "start"
    return replace(body.ranking_query(body.texts, refusal),
                   truncation=Truncation(None, keep) if body.truncate else None,
                   return_documents=bool(body.return_text or body.return_documents),
                   raw_scores=body.raw_scores)


def answer(ranking: Ranking, query: RankingQuery) -> TEIRerankResponse:
    """TEI's answer: a bare array, best first, of every document (cut to `top_n`)."""
    return TEIRerankResponse([
        TEIResult(index=r.index, score=r.relevance_score,
                  text=ranking.texts[r.index] if query.return_documents else None,
                  **FilterFields.of(r))
        for r in ranking.best(query.top_n)])
