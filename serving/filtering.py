"""The filter on the engine for one request's documents: the code the rerank endpoints, the
score endpoint and the filtering proxy share, so all judge by the same rules, limits and code.

`run_filter` runs, in a worker thread: the documents cut to fit where the request asks for it
(`Truncation`: each cut, from its end or its start, until every filter prompt on it fits),
each filter prompt's size checked (`check_prompts_fit`; the caller checks the documents'
count and text sizes first, `PromptLimits.check_documents`), then the caller's work on an
`EngineBackend` for the served model the request names (MCF's own code: `rank_by_filter`,
`MultiGranularFilter`); a client that goes away cancels the sequences in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from sieverag.inference.filters.filter_format import (
    FilterFormat,
    chunk_prompt,
    passage_prompt,
    sentence_prompt,
)
from sieverag.inference.filters.mcf import MCFConfig, document_sentences
from sieverag.inference.llm.base import marked_prompt_ids
from sieverag.inference.types import Document
from sieverag.serving.api.limits import PromptLimits
from sieverag.serving.engine.backend import EngineBackend
from sieverag.serving.engine.batching import BatchingEngine

T = TypeVar("T")

# Cutting a document changes its prompts' tokens by about the tokens cut (a boundary token may
# merge or split): a few rounds of cutting the overflow, with growing slack, make it fit.
_FIT_ROUNDS = 8


@dataclass(frozen=True)
class Truncation:
    """How a document too long for its filter prompts is cut instead of refused: from its
    end (`keep` "start") or its start, until every filter prompt on it fits
    `max_prompt_tokens` (None: the model's context) with its answer within the context."""

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
    the card's prompt format, and how documents too long are cut (None: refused)."""

    model: str
    rules: MCFConfig
    query: str
    documents: Sequence[Document]
    filter_format: FilterFormat = "two_stage"
    truncation: Truncation | None = None
    refusal: DocumentRefusal = DocumentRefusal()


async def run_filter(engine: BatchingEngine, limits: PromptLimits, request: FilterRequest,
                     work: Callable[[EngineBackend, list[Document]], T]
                     ) -> tuple[T, EngineBackend]:
    """`work` on the request model's backend and the documents as judged (cut where the
    request asks for it), once every filter prompt fits (400 naming the first document that
    does not), and the backend (its `meter` holds the tokens used)."""
    backend = EngineBackend(engine, request.model)

    def run() -> T:
        documents = list(request.documents)
        if request.truncation is not None:
            documents = [fit_document(backend, limits, request, index, document)
                         for index, document in enumerate(documents)]
        check_prompts_fit(backend, limits, request.rules, request.query, documents,
                          request.filter_format, request.refusal)
        return work(backend, documents)

    try:
        return await asyncio.to_thread(run), backend
    except asyncio.CancelledError:  # the client went away: so do its sequences
        backend.cancel()
        raise


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


def check_prompts_fit(backend: EngineBackend, limits: PromptLimits, config: MCFConfig,
                      query: str, documents: Sequence[Document],
                      filter_format: FilterFormat = "two_stage",
                      refusal: DocumentRefusal = DocumentRefusal()) -> None:
    """Refuse (400, naming the document by its position) a document whose filter prompt
    leaves no room for its answer in the context."""
    for index, document in enumerate(documents):
        for name, prompt_tokens, answer_tokens in filter_prompt_sizes(
                backend, config, query, document, filter_format):
            limits.check_document_prompt(index, prompt_tokens, answer_tokens, name,
                                         param=refusal.param, remedy=refusal.remedy)


def fit_document(backend: EngineBackend, limits: PromptLimits, request: FilterRequest,
                 index: int, document: Document) -> Document:
    """`document` cut, on the side `request.truncation` keeps, until every filter prompt on it
    fits; refused (400) where even a few tokens of it cannot fit."""
    truncation = request.truncation
    assert truncation is not None
    # A text of more than this many characters holds more tokens than any context: cut it
    # first, so the tokenizer never reads more than a context's worth.
    most_chars = limits.max_model_len * limits.max_token_chars
    text = document.text
    if len(text) > most_chars:
        text = text[:most_chars] if truncation.keep == "start" else text[-most_chars:]
    slack = 0
    for _ in range(_FIT_ROUNDS):
        candidate = dataclasses.replace(document, text=text)
        overflow = max(_overflow(limits, truncation, prompt, answer) for _, prompt, answer
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
        index, "its filter prompts do not fit however much of it is cut: the query and the "
        "prompt fill the context", request.refusal.param, request.refusal.remedy)


def _overflow(limits: PromptLimits, truncation: Truncation, prompt_tokens: int,
              answer_tokens: int) -> int:
    over_context = prompt_tokens + answer_tokens - limits.max_model_len
    if truncation.max_prompt_tokens is None:
        return over_context
    return max(over_context, prompt_tokens - truncation.max_prompt_tokens)
