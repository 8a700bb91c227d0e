"""Ranking a rerank request's documents by the trained filter's score: every document of one
request scored, judged and (optionally) narrowed to its key sentences by MCF, in request
order. What the embedded server's `/v1/rerank` and the filtering proxy run on their engine, and
what the framework adapters run in process (`inference/integrations/in_process.py`): one
implementation, so every number is MCF's.

Documents are plain texts: MCF reads each with no title and its position in the request as
its id. Each comes back as a `RerankResult` (inference/types.py): `relevance_score` is MCF's
P(relevant), the filter's score combined with the request's BM25 and dense scores by the
filter's card (`inference/filters/combination.py`; calibrated where the card holds a fitted
combination, else retrieval's fusion of BM25 and dense, uncalibrated); `kept` is MCF's
verdict under the given `MCFConfig` (its default: P(relevant) at or above the card's fitted
bar, and at least the best document); `key_sentences`, with
`config.sentence_stage`, the kept documents' key sentences' text in document order ([] for a
document not kept).
"""

from __future__ import annotations

from collections.abc import Sequence

from sieverag.inference.filters.combination import Combination
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter, document_sentences
from sieverag.inference.llm.base import LLMBackend
from sieverag.inference.types import Document, RerankResult


def as_documents(texts: Sequence[str]) -> list[Document]:
    """The request's documents as MCF reads them: no title, the request index as id."""
    return [Document(id=str(index), text=text) for index, text in enumerate(texts)]


def rank_by_filter(backend: LLMBackend, config: MCFConfig, query: str,
                   texts: Sequence[str], combination: Combination | None = None
                   ) -> list[RerankResult]:
    """Every document in request order, scored and judged by MCF under `config` with the
    filter's `combination` (None: `PRIORS_ONLY`), and narrowed to its key sentences when
    `config.sentence_stage`."""
    documents = as_documents(texts)
    mcf = MultiGranularFilter(backend, config, combination)
    scores = mcf.chunk_scores(query, documents)
    result = mcf.chunk_verdicts(query, documents, scores)
    if config.sentence_stage:
        result = mcf.narrow(query, result)
    ranked = []
    for document, judged in zip(documents, result.scored, strict=True):
        keys = None
        if config.sentence_stage:
            sentences = document_sentences(document)
            keys = (tuple(sentences[i].strip() for i in judged.details["key_sentences"])
                    if judged.kept else ())
        ranked.append(RerankResult(int(document.id), judged.details["p_relevant"],
                                   judged.kept, keys))
    return ranked


def best_first(ranked: Sequence[RerankResult]) -> list[RerankResult]:
    """`ranked` by relevance_score, best first; ties stay in request order."""
    return sorted(ranked, key=lambda r: -r.relevance_score)
