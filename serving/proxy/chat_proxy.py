"""POST /v1/chat/completions as a filtering proxy (`sieverag serve --proxy-to URL`).

A request that marks documents (`marked_documents`) has them filtered by MCF's own code on
the served filter adapter (`serving.filtering`, as /v1/rerank runs it, under the same rules,
`--local.rerank.*`, and the same limits), its prompt rewritten to hold only the kept passages
(or, at sentence granularity, their key sentences), and is forwarded upstream (`upstream`).
The upstream's answer comes back with a `sieverag` field (and the same object, as compact
JSON, in the `x-sieverag` header; a stream's body is the upstream's own, so there only the
header carries it):

* `kept`: the kept passages' indices (from 0, in request order), best first, the order they
  are forwarded in; `dropped`: the others, ascending.
* `documents_in`, `documents_kept`: how many passages came, and went on.
* `granularity`: "chunk" (whole passages) or "sentence" (key sentences).
* `prompt_tokens_saved`: the forwarded block's tokens less those of a block holding every
  passage, counted with the filter's tokenizer (an estimate of the upstream's saving: its
  tokenizer may count otherwise).
* under a context budget (`--proxy-context-tokens N`, or the request's
  `"sieverag": {"context_tokens": N}`): `context_tokens` (N), `context_tokens_used` (what the
  forwarded passages hold) and `trimmed` (the passage cut to some of its sentences, or null).
  The budget keeps the best context that fits (`passages_within_budget`); `kept` and
  `documents_kept` then count the passages forwarded.

A request that marks no documents goes upstream untouched, its body's bytes as sent (only
`model` replaced, the body written anew, under `--proxy-model`); a body that is not JSON too,
for the upstream to refuse.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from transformers import PreTrainedTokenizerBase

from sieverag.inference.core.types import Document
from sieverag.inference.filters.document_filter import FilterResult
from sieverag.inference.filters.mcf import MultiGranularFilter, document_sentences
from sieverag.serving.api.endpoint_base import ServingContext
from sieverag.serving.context_budget import Candidate, Placed, fit_to_budget, token_counter
from sieverag.serving.filtering import FilterRequest, run_filter
from sieverag.serving.observability import tracing
from sieverag.serving.proxy.generator_span import generator_span, record_answer
from sieverag.serving.proxy.marked_documents import (
    MarkedRequest,
    Passage,
    documents_block,
    find_marked,
    passage_lines,
)
from sieverag.serving.proxy.upstream import Upstream, UpstreamClient, UpstreamError

INFO_FIELD = "sieverag"
INFO_HEADER = "x-sieverag"


@dataclass(frozen=True)
class ProxyTarget:
    """What the proxy forwards to, and the served model (adapter) it filters with."""

    upstream: Upstream
    filter_model: str
    context_tokens: int | None = None  # --proxy-context-tokens


class ChatProxy:
    """The proxy's chat endpoint: filter the marked documents on the context's engine with
    `filter_model`, under the server's rerank rules and limits and with the filter card's
    combination (none: `PRIORS_ONLY`), then forward through `upstream`."""

    def __init__(self, context: ServingContext, filter_model: str,
                 upstream: UpstreamClient, context_tokens: int | None = None) -> None:
        self.context = context
        self.filter_model = filter_model
        self.context_tokens = context_tokens
        self.combination = context.combinations.get(filter_model)
        self.upstream = upstream
        self.upstream_model = upstream.upstream.model

    async def handle(self, request: Request) -> Response:
        raw = await request.body()
        # Parsed off the event loop, as the server's other endpoints parse and tokenise.
        body, marked = await asyncio.to_thread(_parse, raw)
        headers = dict(request.headers)
        if marked is None:
            return await self._forward(self._passed_through(raw, body), headers,
                                       streaming=isinstance(body, dict)
                                       and body.get("stream") is True, body=body)
        info, forwarded = await self._filtered(marked)
        extra = {INFO_HEADER: json.dumps(info, separators=(",", ":"))}
        content = self._encode(forwarded)
        streaming = forwarded.get("stream") is True
        with generator_span(self.upstream.upstream, forwarded, headers,
                            streaming=streaming) as span:
            try:
                if streaming:
                    response = await self.upstream.stream(content, headers, extra)
                    record_answer(span, response.status_code)
                    return response
                status, answer_headers, answer = await self.upstream.post(content, headers)
            except UpstreamError as error:
                tracing.failed(span, error.code)
                return error.response(extra)
            record_answer(span, status, answer)
        answer_headers.update(extra)
        if status >= 400:
            return Response(answer, status_code=status, headers=answer_headers)
        try:
            reply = json.loads(answer)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            return UpstreamError(502, f"the upstream {self.upstream.upstream.chat_url} answered "
                                 f"{status} with a body that is not a JSON object: "
                                 f"{answer[:200]!r}", "upstream_bad_response").response(extra)
        reply[INFO_FIELD] = info
        return JSONResponse(reply, status_code=status, headers=answer_headers)

    async def _forward(self, content: bytes, headers: dict[str, str], *,
                       streaming: bool, body: Any = None) -> Response:
        with generator_span(self.upstream.upstream, body, headers, streaming=streaming) as span:
            try:
                if streaming:
                    response = await self.upstream.stream(content, headers, {})
                    record_answer(span, response.status_code)
                    return response
                status, answer_headers, answer = await self.upstream.post(content, headers)
            except UpstreamError as error:
                tracing.failed(span, error.code)
                return error.response()
            record_answer(span, status, answer)
        return Response(answer, status_code=status, headers=answer_headers)

    def _passed_through(self, raw: bytes, body: Any) -> bytes:
        """An unmarked request's bytes: as sent, unless --proxy-model names the model."""
        if self.upstream_model is None or not isinstance(body, dict):
            return raw
        return self._encode(body)

    def _encode(self, body: dict[str, Any]) -> bytes:
        """The body to forward, naming --proxy-model's model where given."""
        if self.upstream_model is not None:
            body = {**body, "model": self.upstream_model}
        return json.dumps(body, ensure_ascii=False).encode()

    async def _filtered(self, marked: MarkedRequest) -> tuple[dict[str, Any], dict[str, Any]]:
        """MCF's verdict on the marked passages (`sieverag` info) and the body to forward."""
        context = self.context
        rules = context.options.rerank
        if marked.granularity is not None:
            rules = dataclasses.replace(rules, sentence_stage=marked.granularity == "sentence")
        documents = [p.document for p in marked.passages]
        if documents:  # none (an empty list or block) is no work, not an error
            context.limits.check_documents([d.text for d in documents])
        combination = self.combination

        def select(mcf: MultiGranularFilter, judged: list[Document]
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
            result = mcf.select(marked.question, judged)
            kept = kept_passages(marked.passages, result)
            budget = marked.settings.context_tokens or self.context_tokens
            fitted: dict[str, Any] = {}
            if budget is not None:
                kept, fitted = passages_within_budget(context.tokenizer, kept, budget)
            unfiltered, forwarded = (self._block_tokens(marked.passages),
                                     self._block_tokens(kept))
            context.metrics.record_filter("proxy", judged, result)
            context.metrics.record_proxy(unfiltered, forwarded)
            saved = unfiltered - forwarded
            kept_indices = [int(p.document.id) for p in kept]
            info = {"kept": kept_indices,
                    "dropped": sorted(set(range(len(judged))) - set(kept_indices)),
                    "documents_in": len(judged), "documents_kept": len(kept),
                    "granularity": "sentence" if rules.sentence_stage else "chunk",
                    "bar_rule": (f"{result.rule}: {result.rule_reason}" if result.rule
                                 else None),
                    "calibrated": result.calibrated,
                    "prompt_tokens_saved": saved, **fitted}
            tracing.record(tracing.current(), {"sieverag.prompt_tokens_saved": saved,
                                               "sieverag.documents.forwarded": len(kept)})
            return info, marked.forwarded_body(kept)

        request = FilterRequest(self.filter_model, rules, marked.question, documents,
                                combination)
        answer, _ = await run_filter(context.engine, context.limits, request, select)
        return answer

    def _block_tokens(self, passages: Sequence[Passage]) -> int:
        block = documents_block(passages)
        return len(self.context.tokenizer(block, add_special_tokens=False)["input_ids"])


def _parse(raw: bytes) -> tuple[Any, MarkedRequest | None]:
    """The body as JSON (None when it is not: the upstream refuses it in its own words) and
    its marked documents."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None, None
    return body, find_marked(body)


def passages_within_budget(tokenizer: PreTrainedTokenizerBase, kept: Sequence[Passage],
                           max_tokens: int) -> tuple[list[Passage], dict[str, Any]]:
    """The best context of at most `max_tokens` tokens of `tokenizer` (`fit_to_budget`,
    counting the block's numbered lines, its two tags aside) of the passages MCF kept, best
    first: each whole while it fits, then the next one's kept sentences that still fit; each
    holding the text it has there. With the `sieverag` info: `context_tokens` (the budget),
    `context_tokens_used` and `trimmed` (the passage cut to some of its sentences, by its
    index in the request; None when none was)."""
    with tracing.span("sieverag.context_budget",
                      {"sieverag.context_budget.tokens": max_tokens}) as span:
        candidates = [Candidate(p.document.text, tuple(document_sentences(p.document)))
                      for p in kept]
        count = token_counter(tokenizer)

        def placed_passages(placed: Sequence[Placed]) -> list[Passage]:
            return [dataclasses.replace(kept[p.position], document=dataclasses.replace(
                kept[p.position].document, text=p.text)) for p in placed]

        def measure(placed: Sequence[Placed]) -> int:
            return count(passage_lines(placed_passages(placed)))

        placed = fit_to_budget(candidates, max_tokens, measure)
        trimmed = next((int(kept[p.position].document.id) for p in placed if p.trimmed), None)
        used = measure(placed)
        tracing.record(span, {"sieverag.context_budget.used": used,
                              "sieverag.documents.kept": len(kept),
                              "sieverag.context_budget.documents": len(placed),
                              "sieverag.context_budget.trimmed": trimmed is not None})
    return placed_passages(placed), {"context_tokens": max_tokens,
                                     "context_tokens_used": used, "trimmed": trimmed}


def kept_passages(passages: Sequence[Passage], result: FilterResult) -> list[Passage]:
    """The passages MCF kept, best first, each holding the text MCF kept of it (its key
    sentences at sentence granularity) under its own number."""
    return [dataclasses.replace(passages[int(s.document.id)], document=s.document)
            for s in result.kept]
