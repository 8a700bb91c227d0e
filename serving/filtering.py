"""The filter on the engine for one request's documents: the code the rerank endpoints, the
score endpoint and the filtering proxy share, so all judge by the same rules, limits and code.

A request's work is prepared, then run, each in a worker thread:

* `prepare_filter`: the request's MCF built once, on a backend whose sequences the engine
  queues under the request's owner; the documents cut where the request asks for it
  (`Truncation`: to the filter's window, or until every filter prompt on a document holds at
  most a number of tokens); then MCF's own plan of the round (`inference/filters/
  round_plan.py`: the prompts it asks on each document's largest window, and the filter
  tokens the round may use), each prompt checked to fit the context (400 naming the query,
  the only part that can make one overflow);
* the caller checks the request's filter tokens against the server's budget
  (`PromptLimits.check_request_tokens`, 413) before any work, over all its rounds;
* `run_prepared`: the caller's work with that MCF on the documents as judged
  (`rank_with`, `MultiGranularFilter.select`), its sequences taken by the engine in turn
  with other requests' (`BatchingEngine`); a client that goes away cancels the sequences not
  yet run.

`run_filter` does all three for a request of one round.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sieverag.inference.core.types import Document
from sieverag.inference.filters.card.combination import Combination
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
from sieverag.inference.filters.round_plan import RoundPlan, plan_round, prompt_costs
from sieverag.inference.filters.windows import WindowRule
from sieverag.serving.engine.continuous_batching import BatchingEngine
from sieverag.serving.engine.engine_backend import EngineBackend
from sieverag.serving.observability import tracing
from sieverag.serving.observability.filter_spans import mcf_class
from sieverag.serving.request_limits import DocumentRefusal, PromptLimits, Truncation

T = TypeVar("T")

# Cutting a document changes its prompts' tokens by about the tokens cut (a boundary token may
# merge or split): a few rounds of cutting the overflow, with growing slack, make it fit.
_FIT_ROUNDS = 8


@dataclass(frozen=True)
class FilterRequest:
    """What the filter runs on: the served `model`, its rules, the query and the documents,
    the filter card's combination (its prompt format and window; None: no card), and how
    documents too long are cut (None: read window by window, whole)."""

    model: str
    rules: MCFConfig
    query: str
    documents: Sequence[Document]
    combination: Combination | None = None
    truncation: Truncation | None = None
    refusal: DocumentRefusal = DocumentRefusal()
    query_field: str = "query"


@dataclass(frozen=True)
class PreparedRound:
    """A round ready to run: its MCF (on a backend queued on the engine), the documents as
    judged (cut where asked) and MCF's plan of the round."""

    request: FilterRequest
    mcf: MultiGranularFilter
    documents: list[Document]
    plan: RoundPlan

    @property
    def backend(self) -> EngineBackend:
        return self.mcf.backend  # type: ignore[return-value]

    @property
    def tokens(self) -> int:
        """The filter tokens the round may use."""
        return self.plan.tokens


async def prepare_filter(engine: BatchingEngine, limits: PromptLimits, request: FilterRequest,
                         owner: Hashable | None = None) -> PreparedRound:
    """`request`'s MCF, on a backend whose sequences the engine queues under `owner` (None:
    the backend's own), its documents cut where it asks, and MCF's plan of the round, every
    planned prompt checked to fit (400 naming the first document that does not)."""
    backend = EngineBackend(engine, request.model, owner=owner)

    def prepare() -> PreparedRound:
        with tracing.span("sieverag.filter.windows") as span:
            mcf = mcf_class()(backend, request.rules, request.combination)
            documents = list(request.documents)
            if request.truncation is not None:
                documents = [fit_document(mcf, limits, request, index, document)
                             for index, document in enumerate(documents)]
            plan = plan_round(mcf, request.query, documents)
            for index, prompts in enumerate(plan.prompts):
                for prompt in prompts:
                    limits.check_window_prompt(index, prompt.prompt_tokens,
                                               prompt.answer_tokens, prompt.stage,
                                               request.query_field)
            if tracing.active():
                tracing.record(span, window_attributes(mcf.windows, documents) |
                               {"sieverag.filter.tokens_planned": plan.tokens})
            return PreparedRound(request, mcf, documents, plan)

    return await asyncio.to_thread(prepare)


async def run_prepared(prepared: PreparedRound,
                       work: Callable[[MultiGranularFilter, list[Document]], T]) -> T:
    """`work` with the round's MCF on its documents as judged."""
    try:
        return await asyncio.to_thread(work, prepared.mcf, prepared.documents)
    except asyncio.CancelledError:  # the client went away: so do its sequences
        prepared.backend.cancel()
        raise


async def run_filter(engine: BatchingEngine, limits: PromptLimits, request: FilterRequest,
                     work: Callable[[MultiGranularFilter, list[Document]], T]
                     ) -> tuple[T, EngineBackend]:
    """`work` with the request's MCF on the documents as judged (cut where the request asks
    for it), once every prompt of MCF's plan fits (400 naming the first document that does
    not) and the round's filter tokens are within the budget (413), and the backend (its
    `meter` holds the tokens used)."""
    with tracing.span("sieverag.filter", {"gen_ai.request.model": request.model}) as span:
        prepared = await prepare_filter(engine, limits, request)
        limits.check_request_tokens(prepared.tokens, len(prepared.documents))
        answer = await run_prepared(prepared, work)
        usage = prepared.backend.meter.by_agent.values()
        tracing.record(span, {
            "gen_ai.usage.input_tokens": sum(u.prompt_tokens for u in usage),
            "gen_ai.usage.output_tokens": sum(u.completion_tokens for u in usage)})
        return answer, prepared.backend


def window_attributes(rule: WindowRule, documents: Sequence[Document]) -> dict[str, int]:
    """The windows span's attributes: the documents longer than one window, their windows,
    and the windows the filter reads of them (at most `max_windows` each, as MCF reads)."""
    counts = [len(rule.windows(d.text)) for d in documents]
    long = [count for count in counts if count > 1]
    return {"sieverag.documents.in": len(documents), "sieverag.documents.windowed": len(long),
            "sieverag.windows.total": sum(counts),
            "sieverag.windows.read": sum(min(count, rule.max_windows) for count in counts)}


def fit_document(mcf: MultiGranularFilter, limits: PromptLimits, request: FilterRequest,
                 index: int, document: Document) -> Document:
    """`document` cut, on the side `request.truncation` keeps: to the filter's window (MCF's
    `windows`), or until every prompt MCF asks on it (`prompt_costs`) holds at most the
    rule's prompt tokens; refused (400) where even a few tokens of it cannot fit that."""
    truncation = request.truncation
    assert truncation is not None
    if truncation.max_prompt_tokens is None:
        return dataclasses.replace(document, text=mcf.windows.cut(document.text,
                                                                  truncation.keep))
    # A text of more than this many characters holds more tokens than any context: cut it
    # first, so the tokenizer never reads more than a context's worth.
    most_chars = limits.max_model_len * limits.max_token_chars
    text = document.text
    if len(text) > most_chars:
        text = text[:most_chars] if truncation.keep == "start" else text[-most_chars:]
    slack = 0
    for _ in range(_FIT_ROUNDS):
        candidate = dataclasses.replace(document, text=text)
        overflow = max(cost.prompt_tokens - truncation.max_prompt_tokens
                       for cost in prompt_costs(mcf, request.query, candidate))
        if overflow <= 0:
            return candidate
        starts = mcf.backend.tokenizer(text, add_special_tokens=False,
                                   return_offsets_mapping=True)["offset_mapping"]
        keep = len(starts) - overflow - slack
        if keep <= 0:
            break
        text = (text[:starts[keep][0]] if truncation.keep == "start"
                else text[starts[len(starts) - keep][0]:])
        slack = max(1, 2 * slack)
    raise limits.document_too_long(
        index, f"its filter prompts hold more than {truncation.max_prompt_tokens} tokens "
        "however much of it is cut: the query and the prompt fill them",
        request.refusal.param, request.refusal.remedy)
