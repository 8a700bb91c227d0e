"""The rerank endpoints' work besides routing (POST /v1/rerank: the trained filter as a
reranker, in the Cohere v1/Jina schema vLLM serves; POST /v2/rerank: the same in Cohere's v2
schema): documents cut to `max_tokens_per_doc`, the filter prompts' size check, shared with
the filtering proxy, and the response bodies.

The request's documents are ranked by `rank_by_filter` (inference/filters/ranking.py: one
round of MCF, by MCF's own code) on the served model or adapter the request names
(`EngineBackend`), so every number is MCF's by construction; each result is a
`RerankResult` (inference/types.py), the shape the clients read:

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

import uuid
from collections.abc import Sequence
from dataclasses import replace

from transformers import PreTrainedTokenizerBase

from sieverag.inference.filters.filter_format import (
    FilterFormat,
    chunk_prompt,
    passage_prompt,
    sentence_prompt,
)
from sieverag.inference.filters.mcf import MCFConfig, document_sentences
from sieverag.inference.filters.ranking import best_first
from sieverag.inference.llm.base import marked_prompt_ids
from sieverag.inference.types import Document, RerankResult
from sieverag.serving.engine_backend import EngineBackend
from sieverag.serving.limits import PromptLimits
from sieverag.serving.responses import (
    MetaTokens,
    RerankMeta,
    RerankResponse,
    RerankUsage,
    RerankV2Response,
)


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
