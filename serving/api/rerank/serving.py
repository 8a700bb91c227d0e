"""The rerank endpoints' work (`Reranker`): the trained filter as a reranker, at POST
/v1/rerank in the Cohere v1/Jina schema vLLM serves and at POST /v2/rerank in Cohere's v2
schema.

The request's documents are ranked by `rank_by_filter` (inference/filters/ranking.py: one
round of MCF, by MCF's own code) on the served model or adapter the request names
(`serving.filtering`, shared with the filtering proxy), so every number is MCF's by
construction; each result is a `RerankResult` (inference/types.py), the shape the clients
read:

* `relevance_score` — MCF's P(relevant): the filter's score combined with the request's BM25
  and dense scores by the filter card's fitted combination, a calibrated probability
  (inference/filters/ranking.py); results are sorted by it, best first.
* `kept` — MCF's verdict under the server's rules (`--local.rerank.*`, an `MCFConfig`). The
  default is MCF's default bar: P(relevant) at or above the card's calibrated bar, and at
  least the best document; `--local.rerank.bar fixed` keeps log P(Yes) − log P(No) >=
  `--local.rerank.threshold` (on the filter's own score, not the combination).
* `key_sentences` — with `"granularity": "sentence"`: MCF's sentence stage on the kept
  documents, their key sentences' text in document order (sentences split as MCF splits
  them; every sentence where the filter's reply names none or does not parse); [] for a
  document not kept.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace

from fastapi.responses import Response
from transformers import PreTrainedTokenizerBase

from sieverag.inference.filters.ranking import as_documents, best_first, rank_by_filter
from sieverag.inference.types import RerankResult
from sieverag.serving.api.context import ServingContext
from sieverag.serving.api.rerank.protocol import (
    MetaTokens,
    RerankBody,
    RerankMeta,
    RerankRequest,
    RerankResponse,
    RerankUsage,
    RerankV2Request,
    RerankV2Response,
)
from sieverag.serving.filtering import run_filter


@dataclass(frozen=True)
class Ranking:
    """The filter's ranking of a request's documents, their texts (as the request sent them)
    and the prompt and completion tokens the filter used."""

    results: list[RerankResult]
    texts: list[str]
    prompt_tokens: int
    completion_tokens: int


class Reranker:
    """The rerank endpoints: each request's documents ranked by the filter it names."""

    def __init__(self, context: ServingContext) -> None:
        self.context = context

    async def rerank(self, body: RerankRequest) -> Response:
        """POST /v1/rerank."""
        ranking = await self.rank(body)
        return await self.context.respond(body, lambda: rerank_response(
            body.model, ranking.results, ranking.texts, top_n=body.top_n,
            return_documents=body.return_documents,
            total_tokens=ranking.prompt_tokens + ranking.completion_tokens))

    async def rerank_v2(self, body: RerankV2Request) -> Response:
        """POST /v2/rerank."""
        ranking = await self.rank(body)
        return await self.context.respond(body, lambda: rerank_v2_response(
            ranking.results, top_n=body.top_n, input_tokens=ranking.prompt_tokens,
            output_tokens=ranking.completion_tokens))

    async def rank(self, body: RerankBody) -> Ranking:
        """The filter's ranking of the documents of `body`."""
        context = self.context
        context.check_model(body.model)
        texts = body.texts()
        judged = texts
        if body.max_tokens_per_doc is not None and texts:
            judged = await asyncio.to_thread(cut_to_tokens, context.tokenizer, texts,
                                             body.max_tokens_per_doc)
        context.limits.check_documents(judged)
        rules = context.options.rerank
        if body.granularity is not None:
            rules = dataclasses.replace(rules, sentence_stage=body.granularity == "sentence")
        combination = context.combinations.get(body.model)
        ranked, backend = await run_filter(
            context.engine, body.model, context.limits, rules, body.query,
            as_documents(judged),
            lambda backend: rank_by_filter(backend, rules, body.query, judged, combination),
            filter_format=combination.filter_format if combination else "two_stage")
        usage = backend.meter.by_agent.values()
        return Ranking(ranked, texts, sum(u.prompt_tokens for u in usage),
                       sum(u.completion_tokens for u in usage))


def cut_to_tokens(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_tokens: int
                  ) -> list[str]:
    """Each text cut to its first `max_tokens` tokens (where the next token starts); a text
    that fits is kept whole."""
    cut = []
    for text in texts:
        starts = tokenizer(text, add_special_tokens=False,
                           return_offsets_mapping=True)["offset_mapping"]
        cut.append(text[:starts[max_tokens][0]] if len(starts) > max_tokens else text)
    return cut


def rerank_response(model: str, ranked: Sequence[RerankResult], texts: Sequence[str], *,
                    top_n: int | None, return_documents: bool, total_tokens: int
                    ) -> RerankResponse:
    """The /v1/rerank body: results best first (ties in request order), cut to `top_n` (0 or
    None: all), each with its document's text when `return_documents`."""
    results = [replace(result, document={"text": texts[result.index]}) if return_documents
               else result for result in best_first(ranked)[:top_n or None]]
    return RerankResponse(id=rerank_id(), model=model,
                          usage=RerankUsage(total_tokens=total_tokens), results=results)


def rerank_v2_response(ranked: Sequence[RerankResult], *, top_n: int | None,
                       input_tokens: int, output_tokens: int) -> RerankV2Response:
    """The /v2/rerank body: results best first (ties in request order), cut to `top_n` (0 or
    None: all), without documents, and Cohere's `meta` with the tokens the filter used."""
    return RerankV2Response(
        id=rerank_id(), results=best_first(ranked)[:top_n or None],
        meta=RerankMeta(tokens=MetaTokens(input_tokens=input_tokens,
                                          output_tokens=output_tokens)))


def rerank_id() -> str:
    return f"rerank-{uuid.uuid4().hex}"
