"""Cohere's rerank dialect, v1 and v2, which Jina and vLLM speak too.

* v1 (`POST /v1/rerank`: Cohere v1, Jina, vLLM): `documents` (strings or `{text}`), `top_n`,
  `return_documents`, `max_tokens_per_doc`, `max_chunks_per_doc` and vLLM's own
  `truncate_prompt_tokens`, `truncation_side` and `max_tokens_per_query`; the answer
  `{id, model, usage, results[{index, relevance_score, document?: {text}}]}`. Cohere v1, Jina
  and vLLM send one body (vLLM's adds its truncation fields) and read one answer, so one
  module serves them; the detection table names vLLM apart only for its fields' refusals.
* v2 (`POST /v2/rerank`): Cohere's v2 body; the answer `{id, results, meta}`, the results
  without documents and `meta` with the tokens the filter used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from sieverag.inference.core.types import RerankResult
from sieverag.inference.filters.ranking import best_first
from sieverag.serving.api.bodies import SparseBody
from sieverag.serving.api.field_policy import OnlyAt
from sieverag.serving.api.rerank.protocol import (
    PromptTokenLimit,
    RerankBody,
    RerankUsage,
    RerankV1Body,
    prompt_token_cut,
    rerank_id,
)
from sieverag.serving.api.rerank.query import Ranking, RankingQuery
from sieverag.serving.request_limits import DocumentRefusal


class VLLMRequest(RerankV1Body):
    """vLLM's /v1/rerank body: Cohere v1's, with vLLM's truncation fields."""

    truncate_prompt_tokens: PromptTokenLimit | None = Field(
        None, description="vLLM: cut each document until each of its filter prompts "
                                 "holds at most this many tokens; -1: to the filter's window")
    truncation_side: Literal["right", "left"] = Field(
        "right", description="vLLM, with truncate_prompt_tokens: right cuts the document's "
                             "end, left its start")


class RerankV2Request(RerankBody):
    """POST /v2/rerank: Cohere's v2 schema, plus `granularity`."""

    relevant_spans: Annotated[Any, OnlyAt(
        'null or {"mode": "disabled"}', 'Cohere\'s relevant spans are not implemented: '
        'return_spans: true gives each document\'s sentences as spans, with the text the '
        'filter keeps (pruned_text)',
        lambda spans: spans is None or (isinstance(spans, dict)
                                        and spans.get("mode") == "disabled"))] = None


class RerankResponse(SparseBody):
    """POST /v1/rerank: the Cohere v1/Jina/vLLM schema."""

    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class ApiVersion(BaseModel):
    version: Literal["2"] = "2"


class BilledUnits(BaseModel):
    search_units: int = 1


class MetaTokens(BaseModel):
    input_tokens: int
    output_tokens: int


class RerankMeta(BaseModel):
    """Cohere's `meta`: the API version, billed units (one search) and the tokens used."""

    api_version: ApiVersion = Field(default_factory=ApiVersion)
    billed_units: BilledUnits = Field(default_factory=BilledUnits)
    tokens: MetaTokens


class RerankV2Response(SparseBody):
    """POST /v2/rerank: Cohere's v2 schema (results carry no document)."""

    id: str
    results: list[RerankResult]
    meta: RerankMeta


def ranking_query(body: VLLMRequest) -> RankingQuery:
    """A Cohere v1, Jina or vLLM request as the filter's query: vLLM's
    `truncate_prompt_tokens` cuts each document (on `truncation_side`)."""
    refusal = DocumentRefusal("documents", "send max_tokens_per_doc, or "
                                           "truncate_prompt_tokens: -1, to cut it")
    query = body.ranking_query(body.documents, refusal)
    if body.truncate_prompt_tokens is None:
        return query
    return replace(query, truncation=prompt_token_cut(body.truncate_prompt_tokens,
                                                      body.truncation_side))


def answer(ranking: Ranking, query: RankingQuery) -> RerankResponse:
    """The v1 answer to `query` (`rerank_response`)."""
    return rerank_response(ranking.model, ranking.results, ranking.texts, top_n=query.top_n,
                           return_documents=query.return_documents,
                           total_tokens=ranking.total_tokens)


def rerank_response(model: str, ranked: Sequence[RerankResult], texts: Sequence[str], *,
                    top_n: int | None, return_documents: bool, total_tokens: int
                    ) -> RerankResponse:
    """The /v1/rerank body: results best first (ties in request order), cut to `top_n` (0 or
    None: all), each with its document's text when `return_documents`."""
    results = [replace(result, document={"text": texts[result.index]}) if return_documents
               else result for result in best_first(ranked)[:top_n or None]]
    return RerankResponse(id=rerank_id(), model=model,
                          usage=RerankUsage(total_tokens=total_tokens), results=results)


def v2_ranking_query(body: RerankV2Request) -> RankingQuery:
    """A Cohere v2 request as the filter's query."""
    return body.ranking_query(body.documents, DocumentRefusal(
        "documents", "send max_tokens_per_doc to cut it"))


def v2_answer(ranking: Ranking, query: RankingQuery) -> RerankV2Response:
    """The /v2/rerank body: results best first (ties in request order), cut to `top_n` (0 or
    None: all), without documents, and Cohere's `meta` with the tokens the filter used."""
    return RerankV2Response(
        id=rerank_id(), results=ranking.best(query.top_n),
        meta=RerankMeta(tokens=MetaTokens(input_tokens=ranking.prompt_tokens,
                                          output_tokens=ranking.completion_tokens)))
