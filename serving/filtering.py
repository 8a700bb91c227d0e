"""The filter on the engine for one request's documents: the code /v1/rerank (both schemas)
and the filtering proxy share, so both judge by the same rules, limits and code.

`run_filter` checks, in a worker thread, each filter prompt's size (`check_prompts_fit`; the
caller checks the documents' count and text sizes first, `PromptLimits.check_documents`), then
runs the caller's work on an `EngineBackend` for the served model the request names (MCF's
own code: `rank_by_filter`, `MultiGranularFilter`); a client that goes away cancels the sequences
in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TypeVar

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


async def run_filter(engine: BatchingEngine, model: str, limits: PromptLimits,
                     rules: MCFConfig, query: str, documents: Sequence[Document],
                     work: Callable[[EngineBackend], T], *,
                     filter_format: FilterFormat = "two_stage") -> tuple[T, EngineBackend]:
    """`work` on `model`'s backend, once every filter prompt of `documents` fits (400 naming
    the first that does not), and the backend (its `meter` holds the tokens used)."""
    backend = EngineBackend(engine, model)

    def run() -> T:
        check_prompts_fit(backend, limits, rules, query, documents, filter_format)
        return work(backend)

    try:
        return await asyncio.to_thread(run), backend
    except asyncio.CancelledError:  # the client went away: so do its sequences
        backend.cancel()
        raise


def check_prompts_fit(backend: EngineBackend, limits: PromptLimits, config: MCFConfig,
                      query: str, documents: Sequence[Document],
                      filter_format: FilterFormat = "two_stage") -> None:
    """Refuse (400, naming the document by its position) a document whose chunk prompt (a
    one-pass filter's passage prompt), or under a two-stage filter's sentence stage its
    sentence prompt, leaves no room for its answer in the context."""
    for index, document in enumerate(documents):
        if filter_format == "one_pass":
            prompt = passage_prompt(query, document_sentences(document) or [document.text],
                                    document.title)
            ids, _ = marked_prompt_ids(backend.tokenizer, backend.render(prompt))
            limits.check_document_prompt(index, len(ids), 1, "chunk")
            continue
        _, ids = backend.encode(chunk_prompt(query, document.text, document.title))
        limits.check_document_prompt(index, len(ids), 1, "chunk")
        sentences = document_sentences(document)
        if config.sentence_stage and len(sentences) > 1:  # one sentence: MCF asks nothing
            _, ids = backend.encode(sentence_prompt(query, sentences, document.title))
            limits.check_document_prompt(index, len(ids), config.sentence_max_new_tokens,
                                         "sentence")
