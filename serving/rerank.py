"""POST /v1/rerank: the trained filter as a reranker, in the Cohere/Jina schema vLLM serves.

The request's documents are one round of MCF (inference/filters/mcf.py), run by MCF's own
code on the served model or adapter the request names (`EngineBackend`), so every number is
MCF's by construction:

* `relevance_score` — P("Yes") of the filter's chunk question, normalised over Yes/No (the
  `p_yes` of `MultiGranularFilter.chunk_scores`); results are sorted by it, best first.
* `kept` — MCF's verdict under the server's rules (`--local.rerank.*`, an `MCFConfig`). The
  default is MCF's default bar, the round's 2 best documents by the filter's score fused with
  BM25, so a kept document need not be among the highest `relevance_score`s;
  `--local.rerank.bar fixed` keeps log P(Yes) − log P(No) >= `--local.rerank.threshold`
  (threshold 0: relevance_score >= 0.5).
* `key_sentences` — with `"granularity": "sentence"`: MCF's sentence stage on the kept
  documents, their key sentences' text in document order (sentences split as MCF splits
  them; every sentence where the filter's reply names none or does not parse); [] for a
  document not kept.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sieverag.inference.filters.filter_format import chunk_prompt, sentence_prompt
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter, document_sentences
from sieverag.inference.llm.base import LLMBackend
from sieverag.inference.types import Document
from sieverag.serving.engine_backend import EngineBackend
from sieverag.serving.limits import PromptLimits


@dataclass(frozen=True)
class RankedDocument:
    """One request document as MCF judged it; `key_sentences` is None at chunk granularity."""

    index: int
    relevance_score: float
    kept: bool
    key_sentences: tuple[str, ...] | None


def as_documents(texts: Sequence[str]) -> list[Document]:
    """The request's documents as MCF reads them: no title, the request index as id."""
    return [Document(id=str(index), text=text) for index, text in enumerate(texts)]


def check_prompts_fit(backend: EngineBackend, limits: PromptLimits, config: MCFConfig,
                      query: str, documents: Sequence[Document]) -> None:
    """Refuse (400, naming the document by its position) a document whose chunk prompt, or
    under the sentence stage its sentence prompt, leaves no room for its answer in the
    context."""
    for index, document in enumerate(documents):
        _, ids = backend.encode(chunk_prompt(query, document.text, document.title))
        limits.check_document_prompt(index, len(ids), 1, "chunk")
        sentences = document_sentences(document)
        if config.sentence_stage and len(sentences) > 1:  # one sentence: MCF asks nothing
            _, ids = backend.encode(sentence_prompt(query, sentences, document.title))
            limits.check_document_prompt(index, len(ids), config.sentence_max_new_tokens,
                                         "sentence")


def rank_documents(backend: LLMBackend, config: MCFConfig, query: str,
                   texts: Sequence[str]) -> list[RankedDocument]:
    """Every document in request order, scored and judged by MCF under `config` (and narrowed
    to its key sentences when `config.sentence_stage`)."""
    documents = as_documents(texts)
    mcf = MultiGranularFilter(backend, config)
    scores = mcf.chunk_scores(query, documents)
    result = mcf.chunk_verdicts(query, documents, scores)
    if config.sentence_stage:
        result = mcf.narrow(query, result)
    ranked = []
    for document, score, judged in zip(documents, scores, result.scored, strict=True):
        keys = None
        if config.sentence_stage:
            sentences = document_sentences(document)
            keys = (tuple(sentences[i].strip() for i in judged.details["key_sentences"])
                    if judged.kept else ())
        ranked.append(RankedDocument(int(document.id), score["p_yes"], judged.kept, keys))
    return ranked


def rerank_body(model: str, ranked: Sequence[RankedDocument], texts: Sequence[str], *,
                top_n: int | None, return_documents: bool, total_tokens: int
                ) -> dict[str, Any]:
    """The response body: results best first (ties in request order), cut to `top_n`."""
    best_first = sorted(ranked, key=lambda r: -r.relevance_score)[:top_n or None]
    results = []
    for entry in best_first:
        result: dict[str, Any] = {"index": entry.index, "relevance_score": entry.relevance_score}
        if return_documents:
            result["document"] = {"text": texts[entry.index]}
        result["kept"] = entry.kept
        if entry.key_sentences is not None:
            result["key_sentences"] = list(entry.key_sentences)
        results.append(result)
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": model,
            "usage": {"total_tokens": total_tokens}, "results": results}
