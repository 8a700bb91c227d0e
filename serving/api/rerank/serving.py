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
* at sentence granularity (`"granularity": "sentence"`, or `"return_spans": true`; MCF's
  sentence stage on the kept documents, sentences split as MCF splits them):
  `key_sentences`, the kept documents' key sentences' text in document order ([] for a
  document not kept); `pruned_text`, the text MCF passes on, exactly what the filtering proxy
  forwards for that document ("" for one not kept); and, unless `"return_spans": false`,
  `spans`: every sentence as `{start, end, kept, score?}`, character offsets into the
  document as sent (a document cut at its start counted from its uncut text), `score` the
  sentence's P(relevant) from a one-pass filter (a two-stage filter names its key sentences
  and scores none).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace

from fastapi.responses import Response
from transformers import PreTrainedTokenizerBase

from sieverag.inference.filters.combination import logit_of
from sieverag.inference.filters.ranking import as_documents, best_first, rank_by_filter
from sieverag.inference.types import Document, RerankResult
from sieverag.serving.api.context import ServingContext
from sieverag.serving.api.errors import APIError
from sieverag.serving.api.rerank.protocol import (
    InfinityRerankResponse,
    InfinityResult,
    MetaTokens,
    RerankBody,
    RerankMeta,
    RerankRequest,
    RerankResponse,
    RerankUsage,
    RerankV2Request,
    RerankV2Response,
    TEIRerankResponse,
    TEIResult,
    VoyageRerankResponse,
    VoyageResult,
)
from sieverag.serving.engine.backend import EngineBackend
from sieverag.serving.filtering import DocumentRefusal, FilterRequest, run_filter

# The probabilities raw_score reads are kept this far from 0 and 1.
_EPSILON = 1e-12


@dataclass(frozen=True)
class Ranking:
    """The filter's ranking of a request's documents, their texts (as the request sent them)
    and the prompt and completion tokens the filter used."""

    model: str
    results: list[RerankResult]
    texts: list[str]
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Reranker:
    """The rerank endpoints: each request's documents ranked by the filter it names."""

    def __init__(self, context: ServingContext) -> None:
        self.context = context

    async def rerank(self, body: RerankRequest) -> Response:
        """POST /v1/rerank, answered in the request's dialect."""
        dialect = body.dialect()
        ranking = await self.rank(body)
        results = ranking.results
        if body.raw_scores:
            results = [replace(r, relevance_score=raw_score(r.relevance_score))
                       for r in results]
        top, documents = body.result_count(), body.wants_documents()
        if dialect == "tei":
            return await self.context.respond(body, lambda: tei_response(
                results, ranking.texts, top_n=top, return_text=documents))
        if dialect == "infinity":
            return await self.context.respond(body, lambda: infinity_response(
                ranking.model, results, ranking.texts, top_n=top, return_documents=documents,
                total_tokens=ranking.total_tokens))
        if dialect == "voyage":
            return await self.context.respond(body, lambda: voyage_response(
                ranking.model, results, ranking.texts, top_k=top, return_documents=documents,
                total_tokens=ranking.total_tokens))
        return await self.context.respond(body, lambda: rerank_response(
            ranking.model, results, ranking.texts, top_n=top, return_documents=documents,
            total_tokens=ranking.total_tokens))

    async def rerank_v2(self, body: RerankV2Request) -> Response:
        """POST /v2/rerank."""
        ranking = await self.rank(body)
        return await self.context.respond(body, lambda: rerank_v2_response(
            ranking.results, top_n=body.top_n, input_tokens=ranking.prompt_tokens,
            output_tokens=ranking.completion_tokens))

    def model_of(self, name: str | None) -> str:
        """The served model a request names; without one (TEI names none), the one adapter
        served."""
        served = self.context.served
        if name is not None:
            self.context.check_model(name)
            return name
        adapters = served.names[1:]
        if len(adapters) != 1:
            raise APIError(400, "model is missing and this server serves "
                           f"{len(adapters)} adapters: name the filter to rank with, one of "
                           f"{', '.join(served.names)}", param="model")
        return adapters[0]

    async def rank(self, body: RerankBody) -> Ranking:
        """The filter's ranking of the documents of `body`."""
        context = self.context
        model = self.model_of(body.model)
        body.check_query()
        body.check_documents_given()
        texts = body.texts_sent()
        refusal = DocumentRefusal(body.documents_field(), body.oversize_remedy())
        cut_rule = body.cut_rule()
        query, judged = body.query, texts
        if isinstance(body, RerankRequest) and body.max_tokens_per_query is not None:
            (query,) = await asyncio.to_thread(cut_to_tokens, context.tokenizer, [query],
                                               body.max_tokens_per_query)
        if body.max_tokens_per_doc is not None and texts:
            judged = await asyncio.to_thread(cut_to_tokens, context.tokenizer, texts,
                                             body.max_tokens_per_doc)
        context.limits.check_documents(judged, param=refusal.param)
        rules = context.options.rerank
        rules = dataclasses.replace(
            rules, sentence_stage=body.sentence_stage(rules.sentence_stage),
            max_windows_per_doc=body.windows_per_doc(rules.max_windows_per_doc))
        combination = context.combinations.get(model)
        request = FilterRequest(model, rules, query, as_documents(judged), combination,
                                cut_rule, refusal)

        def ranked_on(backend: EngineBackend, documents: list[Document]
                      ) -> list[RerankResult]:
            ranked = rank_by_filter(backend, rules, query, documents, combination,
                                    spans=body.wants_spans())
            if cut_rule is None:
                return ranked
            # A document cut at its start: its spans counted from the text as sent.
            return [at_offset(r, cut_rule.start_in(judged[r.index], documents[r.index].text))
                    for r in ranked]

        ranked, backend = await run_filter(context.engine, context.limits, request,
                                           ranked_on)
        usage = backend.meter.by_agent.values()
        return Ranking(model, ranked, texts, sum(u.prompt_tokens for u in usage),
                       sum(u.completion_tokens for u in usage))


def at_offset(result: RerankResult, offset: int) -> RerankResult:
    """`result` with its sentence spans moved `offset` characters on."""
    if not offset or result.spans is None:
        return result
    return replace(result, spans=tuple(replace(span, start=span.start + offset,
                                               end=span.end + offset)
                                       for span in result.spans))


def raw_score(probability: float) -> float:
    """A P(relevant) as the combined logit it is the sigmoid of (TEI's and Infinity's
    `raw_scores`), finite however close to 0 or 1."""
    return logit_of(min(max(probability, _EPSILON), 1.0 - _EPSILON))


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


def infinity_response(model: str, ranked: Sequence[RerankResult], texts: Sequence[str], *,
                      top_n: int | None, return_documents: bool, total_tokens: int
                      ) -> InfinityRerankResponse:
    """Infinity's answer: the Cohere body, each document the string."""
    return InfinityRerankResponse(
        id=rerank_id(), model=model, usage=RerankUsage(total_tokens=total_tokens), results=[
            InfinityResult(index=r.index, relevance_score=r.relevance_score,
                           document=texts[r.index] if return_documents else None,
                           kept=r.kept, key_sentences=r.key_sentences,
                           pruned_text=r.pruned_text, spans=r.spans, bar_rule=r.bar_rule)
            for r in best_first(ranked)[:top_n or None]])


def voyage_response(model: str, ranked: Sequence[RerankResult], texts: Sequence[str], *,
                    top_k: int | None, return_documents: bool, total_tokens: int
                    ) -> VoyageRerankResponse:
    """Voyage's answer: `data` best first, cut to `top_k`, each document the string."""
    return VoyageRerankResponse(model=model, usage=RerankUsage(total_tokens=total_tokens), data=[
        VoyageResult(index=r.index, relevance_score=r.relevance_score,
                     document=texts[r.index] if return_documents else None, kept=r.kept,
                     key_sentences=r.key_sentences, pruned_text=r.pruned_text, spans=r.spans,
                     bar_rule=r.bar_rule)
        for r in best_first(ranked)[:top_k or None]])


def tei_response(ranked: Sequence[RerankResult], texts: Sequence[str], *, top_n: int | None,
                 return_text: bool) -> TEIRerankResponse:
    """TEI's answer: a bare array, best first, of every document (cut to `top_n`, which
    LiteLLM sends TEI)."""
    return TEIRerankResponse([
        TEIResult(index=r.index, score=r.relevance_score,
                  text=texts[r.index] if return_text else None, kept=r.kept,
                  key_sentences=r.key_sentences, pruned_text=r.pruned_text, spans=r.spans,
                  bar_rule=r.bar_rule)
        for r in best_first(ranked)[:top_n or None]])


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
