"""POST /v1/score's work (`Scorer`): each (query, document) pair scored by the filter.

The documents of one query are ranked together, as one /v1/rerank request of that query
ranks them (`RerankServing.rank`'s code: `serving.filtering` and `rank_with`), so a pair's
`score` equals that document's `relevance_score` there; pairs of different queries are ranked
per query. The documents' count and the filter tokens are checked over the whole request,
before any round runs, and its rounds take the engine's turns as one request.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict

from fastapi.responses import Response

from sieverag.inference.core.types import RerankResult
from sieverag.inference.filters.ranking import as_documents, rank_with
from sieverag.serving.api.endpoint_base import Endpoint
from sieverag.serving.api.generation_protocol import TokenUsage
from sieverag.serving.api.rerank.protocol import prompt_token_cut
from sieverag.serving.api.score.protocol import ScoreData, ScoreRequest, ScoreResponse
from sieverag.serving.filtering import (
    FilterRequest,
    PreparedRound,
    prepare_filter,
    run_prepared,
)
from sieverag.serving.request_limits import DocumentRefusal


class Scorer(Endpoint):
    """The score endpoint on the context's engine."""

    async def score(self, body: ScoreRequest) -> Response:
        context = self.context
        model = context.model_of(body.model)
        pairs = body.pairs()
        field = body.document_field()
        limit = body.truncate_prompt_tokens
        cut_rule = None if limit is None else prompt_token_cut(limit)
        refusal = DocumentRefusal(field, "send truncate_prompt_tokens: -1 to cut it")
        context.limits.check_documents([document for _, document in pairs], param=field)
        by_query: dict[str, list[int]] = defaultdict(list)
        for index, (query, _) in enumerate(pairs):
            by_query[query].append(index)
        rules = context.options.rerank
        combination = context.combinations.get(model)
        owner = object()  # every query's round takes the engine's turns as one request
        rounds = await asyncio.gather(*(prepare_filter(
            context.engine, context.limits,
            FilterRequest(model, rules, query, as_documents([pairs[i][1] for i in indices]),
                          combination, cut_rule, refusal, body.query_field()), owner)
            for query, indices in by_query.items()))
        context.limits.check_request_tokens(sum(r.tokens for r in rounds), len(pairs))

        async def rank(query: str, prepared: PreparedRound
                       ) -> tuple[list[RerankResult], TokenUsage]:
            ranked = await run_prepared(prepared, lambda mcf, documents: rank_with(
                mcf, query, documents, spans=False,
                observe=lambda result: context.metrics.record_filter("score", documents,
                                                                     result)))
            usage = prepared.backend.meter.by_agent.values()
            return ranked, TokenUsage.of(sum(u.prompt_tokens for u in usage),
                                    sum(u.completion_tokens for u in usage))

        ranked = await asyncio.gather(*(rank(query, prepared) for query, prepared
                                        in zip(by_query, rounds, strict=True)))
        data = [ScoreData(index=indices[r.index], score=r.relevance_score, kept=r.kept)
                for indices, (results, _) in zip(by_query.values(), ranked, strict=True)
                for r in results]
        usage = TokenUsage.of(sum(u.prompt_tokens for _, u in ranked),
                         sum(u.completion_tokens for _, u in ranked))
        return await context.respond(body, lambda: ScoreResponse(
            id=f"score-{uuid.uuid4().hex}", created=int(time.time()), model=model,
            data=sorted(data, key=lambda d: d.index), usage=usage))
