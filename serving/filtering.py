"""The filter on the engine for one request's documents: the code the rerank endpoints, the
score endpoint and the filtering proxy share, so all judge by the same rules, limits and code.

A request's work is prepared, then run, each in a worker thread:

* `prepare_filter`: the documents cut where the request asks for it (`Truncation`: to the
  filter's window, or until every filter prompt on a document holds at most a number of
  tokens), each document's windows planned as MCF will read them (`inference/filters/
  windows.py`: a document longer than the filter's window is read in at most
  `max_windows_per_doc` windows), every filter prompt on a window checked to fit the context
  (400 naming the query, the only part that can make one overflow), and the filter tokens
  the round may use counted
  (`round_tokens`: the prompts of each document's largest windows, up to the ones it reads);
* the caller checks the request's filter tokens against the server's budget
  (`PromptLimits.check_request_tokens`, 413) before any work, over all its rounds;
* `run_prepared`: the caller's work on an `EngineBackend` for the served model the request
  names (MCF's own code: `rank_by_filter`, `MultiGranularFilter`), its sequences queued on the
  engine under the request's owner, so the engine takes them in turn with other requests'
  (`BatchingEngine`); a client that goes away cancels the sequences not yet run.

`run_filter` does all three for a request of one round.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from sieverag.inference.core.types import Document
from sieverag.inference.filters.combination import PRIORS_ONLY, Combination
from sieverag.inference.filters.filter_format import (
    FilterFormat,
    chunk_prompt,
    passage_prompt,
    sentence_prompt,
)
from sieverag.inference.filters.mcf import MCFConfig, document_sentences, window_rule
from sieverag.inference.filters.windows import WindowRule, window_document
from sieverag.inference.llm.backend_protocol import marked_prompt_ids
from sieverag.serving.api.limits import PromptLimits
from sieverag.serving.engine.continuous_batching import BatchingEngine
from sieverag.serving.engine.engine_backend import EngineBackend
from sieverag.serving.observability import tracing

T = TypeVar("T")

# Cutting a document changes its prompts' tokens by about the tokens cut (a boundary token may
# merge or split): a few rounds of cutting the overflow, with growing slack, make it fit.
_FIT_ROUNDS = 8


@dataclass(frozen=True)
class Truncation:
    """How a document too long is cut, from its end (`keep` "start") or its start: to the
    filter's window (`max_prompt_tokens` None: its first or last window's worth of tokens,
    read as one window), or until every filter prompt on it holds at most
    `max_prompt_tokens` tokens (what is left, read window by window)."""

    max_prompt_tokens: int | None = None
    keep: Literal["start", "end"] = "start"

    def start_in(self, text: str, cut: str) -> int:
        """Where `cut`, `text` as this rule cut it, starts in `text`."""
        return len(text) - len(cut) if self.keep == "end" else 0


@dataclass(frozen=True)
class DocumentRefusal:
    """How a refusal names the request's documents: their field and what to send instead."""

    param: str = "documents"
    remedy: str | None = None


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

    @property
    def filter_format(self) -> FilterFormat:
        return (self.combination or PRIORS_ONLY).filter_format


@dataclass(frozen=True)
class PreparedRound:
    """A round ready to run: its backend, the documents as judged (cut where asked) and the
    filter tokens it may use."""

    request: FilterRequest
    backend: EngineBackend
    documents: list[Document]
    tokens: int


async def prepare_filter(engine: BatchingEngine, limits: PromptLimits, request: FilterRequest,
                         owner: Hashable | None = None) -> PreparedRound:
    """`request`'s documents cut where it asks, their prompts checked to fit (400 naming the
    first document that does not) and its filter tokens counted, on a backend whose
    sequences the engine queues under `owner` (None: the backend's own)."""
    backend = EngineBackend(engine, request.model, owner=owner)

    def prepare() -> PreparedRound:
        with tracing.span("sieverag.filter.windows") as span:
            rule = window_rule(backend, request.rules, request.combination or PRIORS_ONLY)
            documents = list(request.documents)
            if request.truncation is not None:
                documents = [fit_document(backend, limits, request, rule, index, document)
                             for index, document in enumerate(documents)]
            tokens = round_tokens(backend, limits, request, rule, documents)
            if tracing.active():
                tracing.record(span, window_attributes(rule, documents) |
                               {"sieverag.filter.tokens_planned": tokens})
            return PreparedRound(request, backend, documents, tokens)

    return await asyncio.to_thread(prepare)


async def run_prepared(prepared: PreparedRound,
                       work: Callable[[EngineBackend, list[Document]], T]) -> T:
    """`work` on the round's backend and documents as judged."""
    try:
        return await asyncio.to_thread(work, prepared.backend, prepared.documents)
    except asyncio.CancelledError:  # the client went away: so do its sequences
        prepared.backend.cancel()
        raise


async def run_filter(engine: BatchingEngine, limits: PromptLimits, request: FilterRequest,
                     work: Callable[[EngineBackend, list[Document]], T]
                     ) -> tuple[T, EngineBackend]:
    """`work` on the request model's backend and the documents as judged (cut where the
    request asks for it), once every filter prompt fits (400 naming the first document that
    does not) and the request's filter tokens are within the budget (413), and the backend
    (its `meter` holds the tokens used)."""
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


def filter_prompt_sizes(backend: EngineBackend, config: MCFConfig, query: str,
                        document: Document, filter_format: FilterFormat = "two_stage"
                        ) -> list[tuple[str, int, int]]:
    """(name, prompt tokens, answer tokens) of each prompt the filter asks on `document`: a
    one-pass filter's passage prompt; a two-stage filter's chunk prompt and, under its
    sentence stage, its sentence prompt."""
    if filter_format == "one_pass":
        prompt = passage_prompt(query, document_sentences(document) or [document.text],
                                document.title)
        ids, _ = marked_prompt_ids(backend.tokenizer, backend.render(prompt))
        return [("chunk", len(ids), 1)]
    _, ids = backend.encode(chunk_prompt(query, document.text, document.title))
    sizes = [("chunk", len(ids), 1)]
    sentences = document_sentences(document)
    if config.sentence_stage and len(sentences) > 1:  # one sentence: MCF asks nothing
        _, ids = backend.encode(sentence_prompt(query, sentences, document.title))
        sizes.append(("sentence", len(ids), config.sentence_max_new_tokens))
    return sizes


def round_tokens(backend: EngineBackend, limits: PromptLimits, request: FilterRequest,
                 rule: WindowRule, documents: Sequence[Document]) -> int:
    """The filter tokens (prompts and answers) the round may use: for each document, the
    prompts of its largest windows, as many as the filter reads (all of a document that
    fits), and under a sentence stage one more of its largest window (a blank document:
    none). Refuses (400) a query that leaves a prompt on a document's largest window no room
    for its answer in the context."""
    config, query = request.rules, request.query
    empty = Document(id="", text="")
    around = {name: (prompt, answer) for name, prompt, answer in filter_prompt_sizes(
        backend, config, query, empty, request.filter_format)}
    if config.sentence_stage and request.filter_format == "two_stage":
        _, ids = backend.encode(sentence_prompt(query, [""]))
        around["sentence"] = (len(ids), config.sentence_max_new_tokens)
    total = 0
    for index, document in enumerate(documents):
        windows = rule.windows(document.text)
        if not windows:
            continue
        largest = max(windows, key=lambda w: w.tokens)
        probe = document if len(windows) == 1 else window_document(document, largest)
        for name, prompt_tokens, answer_tokens in filter_prompt_sizes(
                backend, config, query, probe, request.filter_format):
            limits.check_window_prompt(index, prompt_tokens, answer_tokens, name,
                                       request.query_field)
        read = sorted((w.tokens for w in windows), reverse=True)[:rule.max_windows]
        total += sum(read) + len(read) * sum(around["chunk"])
        if "sentence" in around:
            total += read[0] + sum(around["sentence"])
    return total


def fit_document(backend: EngineBackend, limits: PromptLimits, request: FilterRequest,
                 rule: WindowRule, index: int, document: Document) -> Document:
    """`document` cut, on the side `request.truncation` keeps: to the filter's window
    (`rule`), or until every filter prompt on it holds at most the rule's prompt tokens;
    refused (400) where even a few tokens of it cannot fit that."""
    truncation = request.truncation
    assert truncation is not None
    if truncation.max_prompt_tokens is None:
        return dataclasses.replace(document, text=rule.cut(document.text, truncation.keep))
    # A text of more than this many characters holds more tokens than any context: cut it
    # first, so the tokenizer never reads more than a context's worth.
    most_chars = limits.max_model_len * limits.max_token_chars
    text = document.text
    if len(text) > most_chars:
        text = text[:most_chars] if truncation.keep == "start" else text[-most_chars:]
    slack = 0
    for _ in range(_FIT_ROUNDS):
        candidate = dataclasses.replace(document, text=text)
        overflow = max(prompt - truncation.max_prompt_tokens for _, prompt, _
                       in filter_prompt_sizes(backend, request.rules, request.query,
                                              candidate, request.filter_format))
        if overflow <= 0:
            return candidate
        starts = backend.tokenizer(text, add_special_tokens=False,
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
