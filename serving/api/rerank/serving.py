"""The rerank endpoints' work (`RerankServing`): the trained filter as a reranker, at POST
/v1/rerank in the dialect the request speaks (`detection` tells which) and at POST /v2/rerank
in Cohere's v2 schema. The dialect's module (`dialects/`) maps the request to one
`RankingQuery` and the `Ranking` back to its client's answer; the work here reads no
dialect's fields.

The query's documents are ranked by `rank_with` (inference/filters/ranking.py: one
round of MCF, by MCF's own code) on the served model or adapter the request names
(`serving.filtering`, shared with the filtering proxy), so every number is MCF's by
construction; each result is a `RerankResult` (inference/core/types.py), the shape the clients
read:

* `relevance_score` — MCF's P(relevant): the filter's score combined with the request's BM25
  and dense scores by the filter card's fitted combination (inference/filters/ranking.py);
  results are sorted by it, best first. `calibrated` says whether it is a calibrated
  probability on the request's round (`Combination.calibrated_on`: false where the shift
  guard finds the round unlike the fitting rounds).
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
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from fastapi.responses import Response
from pydantic import BaseModel
from transformers import PreTrainedTokenizerBase

from sieverag.inference.core.types import Document, RerankResult
from sieverag.inference.filters.card.combination import logit_of
from sieverag.inference.filters.mcf import MultiGranularFilter
from sieverag.inference.filters.ranking import as_documents, best_first, rank_with
from sieverag.inference.retrieval.sentences import split_sentences
from sieverag.serving.api.endpoint_base import Endpoint
from sieverag.serving.api.rerank.detection import RerankRequest, dialect_of
from sieverag.serving.api.rerank.dialects import cohere
from sieverag.serving.api.rerank.protocol import RerankBody
from sieverag.serving.api.rerank.query import Ranking, RankingQuery
from sieverag.serving.context_budget import Candidate, Placed, each_text_measure, fit_to_budget
from sieverag.serving.filtering import FilterRequest, run_filter
from sieverag.serving.observability import tracing

# The probabilities raw_score reads are kept this far from 0 and 1.
_EPSILON = 1e-12

Body = TypeVar("Body", bound=RerankBody)


class RerankServing(Endpoint):
    """The rerank endpoints: each request's documents ranked by the filter it names."""

    async def rerank(self, body: RerankRequest) -> Response:
        """POST /v1/rerank, answered in the dialect the request speaks (`dialect_of`)."""
        dialect = dialect_of(body)
        return await self.answer(body, dialect.query, dialect.answer)

    async def rerank_v2(self, body: cohere.RerankV2Request) -> Response:
        """POST /v2/rerank."""
        return await self.answer(body, cohere.v2_ranking_query, cohere.v2_answer)

    async def answer(self, body: Body, query_of: Callable[[Body], RankingQuery],
                     answer_of: Callable[[Ranking, RankingQuery], BaseModel]) -> Response:
        """`body` ranked by the served model it names, as its dialect's query (`query_of`),
        and answered in its dialect's shape (`answer_of`)."""
        model = self.context.model_of(body.model)
        query = query_of(body)
        ranking = await self.rank(model, query)
        return await self.context.respond(body, lambda: answer_of(ranking, query))

    async def rank(self, model: str, query: RankingQuery) -> Ranking:
        """The ranking of `query`'s documents by the filter `model`."""
        context = self.context
        texts = list(query.texts)
        refusal, cut_rule = query.refusal, query.truncation
        question, judged = query.query, texts
        if query.max_tokens_per_query is not None:
            (question,) = await asyncio.to_thread(cut_to_tokens, context.tokenizer, [question],
                                                  query.max_tokens_per_query)
        if query.max_tokens_per_doc is not None and texts:
            judged = await asyncio.to_thread(cut_to_tokens, context.tokenizer, texts,
                                             query.max_tokens_per_doc)
        context.limits.check_documents(judged, param=refusal.param)
        rules = context.options.rerank
        rules = dataclasses.replace(
            rules, sentence_stage=query.sentence_stage(rules.sentence_stage),
            max_windows_per_doc=query.windows_per_doc(rules.max_windows_per_doc))
        combination = context.combinations.get(model)
        request = FilterRequest(model, rules, question, as_documents(judged), combination,
                                cut_rule, refusal)

        def ranked_on(mcf: MultiGranularFilter, documents: list[Document]
                      ) -> list[RerankResult]:
            ranked = rank_with(
                mcf, question, documents, spans=query.wants_spans(),
                observe=lambda result: context.metrics.record_filter("rerank", documents,
                                                                     result))
            if cut_rule is not None:  # a document cut at its start: spans from its text as sent
                ranked = [at_offset(r, cut_rule.start_in(judged[r.index],
                                                          documents[r.index].text))
                          for r in ranked]
            if query.context_tokens is None:
                return ranked
            return within_budget(context.tokenizer, ranked, texts, query.context_tokens,
                                 rules.sentence_stage)

        ranked, backend = await run_filter(context.engine, context.limits, request,
                                           ranked_on)
        if query.raw_scores:
            ranked = [replace(r, relevance_score=raw_score(r.relevance_score)) for r in ranked]
        usage = backend.meter.by_agent.values()
        return Ranking(model, ranked, texts, sum(u.prompt_tokens for u in usage),
                       sum(u.completion_tokens for u in usage))


def within_budget(tokenizer: PreTrainedTokenizerBase, ranked: Sequence[RerankResult],
                  texts: Sequence[str], max_tokens: int, sentence_stage: bool
                  ) -> list[RerankResult]:
    """The best context of at most `max_tokens` tokens of `tokenizer` (`fit_to_budget`, each
    result's text counted apart): the results the bar kept, best first, whole while they fit
    (a document's text as sent; at sentence granularity its pruned text), then the next one's
    kept sentences that still fit (its key sentences; at chunk granularity its sentences),
    never a cut one. Each holds the text it has in the context as its `pruned_text`; the one
    trimmed, the sentences it holds as its `key_sentences` (and only they kept among its
    `spans`). Traced: the `sieverag.context_budget` span."""
    kept = [r for r in best_first(ranked) if r.kept]
    candidates = [Candidate(r.pruned_text or "", tuple(r.key_sentences or ())) if sentence_stage
                  else Candidate(texts[r.index], tuple(split_sentences(texts[r.index])))
                  for r in kept]
    measure = each_text_measure(tokenizer)
    with tracing.span("sieverag.context_budget",
                      {"sieverag.context_budget.tokens": max_tokens}) as span:
        placed = fit_to_budget(candidates, max_tokens, measure)
        tracing.record(span, {"sieverag.context_budget.used": measure(placed),
                              "sieverag.documents.kept": len(kept),
                              "sieverag.context_budget.documents": len(placed),
                              "sieverag.context_budget.trimmed": any(p.trimmed for p in placed)})
    return [in_context(kept[p.position], candidates[p.position], p) for p in placed]


def in_context(result: RerankResult, candidate: Candidate, placed: Placed) -> RerankResult:
    """`result` holding what `placed` puts of it in the context."""
    if placed.sentences is None:
        return replace(result, pruned_text=placed.text)
    spans = result.spans
    if spans is not None:  # its kept spans after the first `placed.sentences` leave the context
        keys = [i for i, span in enumerate(spans) if span.kept][placed.sentences:]
        spans = tuple(replace(span, kept=False) if i in keys else span
                      for i, span in enumerate(spans))
    return replace(result, pruned_text=placed.text, spans=spans,
                   key_sentences=candidate.sentences[:placed.sentences])


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
