"""Ranking a rerank request's documents by the trained filter's score: every document of one
request scored, judged and (optionally) narrowed to its key sentences by MCF, in request
order. What the embedded server's `/v1/rerank` and `/v1/score` run on their engine, and what
the framework adapters run in process (`inference/integrations/in_process.py`): one
implementation, so every number is MCF's. It is MCF's own `select`, the call the filtering
proxy makes, so what a result says was kept is what the proxy forwards.

Rerank documents are plain texts: MCF reads each with no title and its position in the
request as its id (`as_documents`). Each comes back as a `RerankResult` (inference/core/types.py):
`relevance_score` is MCF's P(relevant), the filter's score combined with the request's BM25
and dense scores by the filter's card (`inference/filters/card/combination.py`; calibrated where
the card holds a fitted combination, else retrieval's fusion of BM25 and dense,
uncalibrated); `kept` is MCF's verdict under the given `MCFConfig` (its default: P(relevant)
at or above the card's fitted bar, and at least the best document). With
`config.sentence_stage`, each result also holds what MCF's sentence stage made of it:
`key_sentences` (the kept document's key sentences' text, in document order; [] for a
document not kept), `pruned_text` (the document's text as MCF passes it on: its key
sentences joined by a space, the whole text where MCF kept it whole — one sentence, a reply
naming none or not parsed — and "" for a document not kept) and, with `spans`, every
sentence as a `SentenceSpan` (where it lies in the text, whether it is key, and its
P(relevant) from a one-pass filter, which scores each sentence). A document longer than the
filter's window is scored by its best read window (`windows`), and its spans are every
sentence of the whole document; a blank one scores 0 and is not kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sieverag.inference.core.types import Document, RerankResult, SentenceSpan
from sieverag.inference.filters.card.combination import Combination
from sieverag.inference.filters.document_filter import FilterResult, ScoredDocument
from sieverag.inference.filters.filter_format import p_relevant
from sieverag.inference.filters.mcf import MCFConfig, MultiGranularFilter
from sieverag.inference.filters.windows import WindowRule
from sieverag.inference.llm.backend_protocol import LLMBackend
from sieverag.inference.retrieval.sentences import sentence_spans


def as_documents(texts: Sequence[str]) -> list[Document]:
    """The request's documents as MCF reads them: no title, the request index as id."""
    return [Document(id=str(index), text=text) for index, text in enumerate(texts)]


def rank_by_filter(backend: LLMBackend, config: MCFConfig, query: str,
                   documents: Sequence[Document], combination: Combination | None = None, *,
                   spans: bool = True,
                   observe: Callable[[FilterResult], object] | None = None
                   ) -> list[RerankResult]:
    """Every document (`as_documents` of the request's texts) in request order, scored and
    judged by MCF under `config` with the filter's `combination` (None: `PRIORS_ONLY`), and
    under `config.sentence_stage` with its key sentences, its pruned text and (`spans`) its
    sentence spans. `observe`, when given, is handed MCF's result (the server counts it)."""
    return rank_with(MultiGranularFilter(backend, config, combination), query, documents,
                     spans=spans, observe=observe)


def rank_with(mcf: MultiGranularFilter, query: str, documents: Sequence[Document], *,
              spans: bool = True, observe: Callable[[FilterResult], object] | None = None
              ) -> list[RerankResult]:
    """`rank_by_filter` with an MCF already built: the server's, whose plan it checked first
    (`serving.filtering`), traced step by step where the request is traced."""
    result = mcf.select(query, documents)
    if observe is not None:
        observe(result)
    bar_rule = f"{result.rule}: {result.rule_reason}" if result.rule else None
    ranked = []
    for document, judged in zip(documents, result.scored, strict=True):
        ranking = RerankResult(int(document.id), judged.details["p_relevant"], judged.kept,
                               bar_rule=bar_rule, calibrated=result.calibrated)
        if mcf.config.sentence_stage:
            ranking = sentence_view(ranking, document, judged, spans=spans, rule=mcf.windows)
        ranked.append(ranking)
    return ranked


def sentence_view(result: RerankResult, document: Document, judged: ScoredDocument, *,
                  spans: bool, rule: WindowRule | None = None) -> RerankResult:
    """`result` with what MCF's sentence stage made of `document` (one of `as_documents`: its
    sentences are `split_sentences` of its text, which `sentence_spans` locates) from
    `judged`, MCF's verdict on it: its key sentences, its pruned text and (`spans`) its
    sentence spans. A document read window by window (`rule`, MCF's) has its sentences as
    the windows cut them, offsets into the whole document; only its best window's can be
    key or scored."""
    text = document.text
    window = judged.details.get("window")
    located, first = sentence_spans(text), 0
    if window is not None and rule is not None:
        located = [(start, end) for start, end, _ in rule.units(text)]
        first = next(i for i, (start, _) in enumerate(located) if start == window[0])
    keys = ({first + k for k in judged.details.get("key_sentences", ())} if judged.kept
            else set())
    scores = [None] * first + list(judged.details.get("sentence_scores") or ())
    return RerankResult(
        result.index, result.relevance_score, result.kept,
        key_sentences=tuple(text[start:end] for i, (start, end) in enumerate(located)
                            if i in keys),
        pruned_text=judged.document.text if judged.kept else "",
        spans=tuple(SentenceSpan(start, end, i in keys,
                                 None if i >= len(scores) or scores[i] is None
                                 else p_relevant(scores[i]))
                    for i, (start, end) in enumerate(located))
        if spans else None, bar_rule=result.bar_rule, calibrated=result.calibrated)


def best_first(ranked: Sequence[RerankResult]) -> list[RerankResult]:
    """`ranked` by relevance_score, best first; ties stay in request order."""
    return sorted(ranked, key=lambda r: -r.relevance_score)
