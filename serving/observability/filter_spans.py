"""The filter's decisions as spans (`tracing`): MCF, run by the rerank endpoints, the score
endpoint and the proxy, with a span around each of its steps in a traced request.

`mcf_class` is how serving builds MCF: `MultiGranularFilter` itself in an untraced request
(nothing changes), else `TracedFilter`, MCF with its steps wrapped (each calls MCF's own
method; none is reimplemented):

* `sieverag.filter.chunk_stage` — the chunk stage (`chunk_stage`: the windows read, the chunk
  scores, the bar): `sieverag.chunks.read` (the windows and whole documents scored),
  `sieverag.chunks.scored_by` ("filter" where the filter was called on the chunks, "priors"
  where the card's combination left it out), `sieverag.documents.in`, `sieverag.documents.kept`;
  * `sieverag.filter.chunk_scores` — the filter's call on the chunks (`chunk_scores`, where
    it reads them): `sieverag.chunks.read`;
  * `sieverag.filter.bar` — the round's bar (`bar`): `sieverag.bar.rule`,
    `sieverag.bar.reason`, `sieverag.bar.threshold`, `sieverag.bar.scores`;
* `sieverag.filter.sentence_stage` — the sentence stage (`narrow`, under `select`):
  `sieverag.sentences.in`,
  `sieverag.sentences.kept`, `sieverag.documents.kept`.

`select` then sets the round's summary on the request's `sieverag.filter` span (opened by
`serving.filtering.run_filter`, which adds the filter's tokens): `filter_attributes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sieverag.inference.core.types import Document
from sieverag.inference.filters.card.combination import Combination, RoundBar, RoundScores
from sieverag.inference.filters.document_filter import FilterResult
from sieverag.inference.filters.mcf import MultiGranularFilter
from sieverag.serving.observability import tracing
from sieverag.serving.observability.metrics import sentence_counts


def mcf_class() -> type[MultiGranularFilter]:
    """MCF as the current request runs it: traced step by step where it is traced."""
    return TracedFilter if tracing.active() else MultiGranularFilter


def filter_attributes(documents: Sequence[Document], result: FilterResult,
                      sentence_stage: bool) -> dict[str, Any]:
    """A round's summary, as the `sieverag.filter` span holds it: the documents in and kept,
    the windowed ones, the bar's rule, reason and value, and under a sentence stage the
    sentences it read and kept (`metrics.sentence_counts`: the same count /metrics makes)."""
    attributes: dict[str, Any] = {
        "sieverag.documents.in": len(documents),
        "sieverag.documents.kept": len(result.kept),
        "sieverag.documents.windowed": sum(1 for s in result.scored
                                           if s.details.get("windows", 0) > 1),
        "sieverag.bar.rule": result.rule, "sieverag.bar.reason": result.rule_reason,
        "sieverag.bar.threshold": result.threshold,
        "sieverag.granularity": "sentence" if sentence_stage else "chunk"}
    if sentence_stage:
        read, kept = sentence_counts(documents, result)
        attributes |= {"sieverag.sentences.in": read, "sieverag.sentences.kept": kept}
    return attributes


class TracedFilter(MultiGranularFilter):
    """MCF with a span around each step (see the module's docstring)."""

    def select(self, question: str, documents: Sequence[Document]) -> FilterResult:
        self._documents = list(documents)  # what the sentence stage's counts are of
        result = super().select(question, documents)
        tracing.record(tracing.current(), filter_attributes(
            documents, result, self.config.sentence_stage))
        return result

    def chunk_stage(self, question: str, documents: Sequence[Document]) -> FilterResult:
        with tracing.span("sieverag.filter.chunk_stage",
                          {"sieverag.documents.in": len(documents)}) as span:
            self._filter_called = False
            result = super().chunk_stage(question, documents)
            read = sum(s.details.get("windows_read", 1) for s in result.scored)
            tracing.record(span, {
                "sieverag.chunks.read": read, "sieverag.documents.kept": len(result.kept),
                "sieverag.chunks.scored_by": "filter" if self._filter_called else "priors"})
            return result

    def chunk_scores(self, question: str, documents: Sequence[Document]) -> list[dict]:
        self._filter_called = True
        with tracing.span("sieverag.filter.chunk_scores",
                          {"sieverag.chunks.read": len(documents)}):
            return super().chunk_scores(question, documents)

    def bar(self, scores: Sequence[float], round_scores: RoundScores,
            combination: Combination | None = None, unlike: Sequence[str] | None = None
            ) -> RoundBar:
        with tracing.span("sieverag.filter.bar", {"sieverag.bar.scores": len(scores)}) as span:
            decided = super().bar(scores, round_scores, combination, unlike)
            tracing.record(span, {"sieverag.bar.rule": decided.rule,
                                  "sieverag.bar.reason": decided.reason,
                                  "sieverag.bar.threshold": decided.bar})
            return decided

    def narrow(self, question: str, chunks: FilterResult) -> FilterResult:
        with tracing.span("sieverag.filter.sentence_stage") as span:
            result = super().narrow(question, chunks)
            read, kept = sentence_counts(self._documents, result)
            tracing.record(span, {"sieverag.sentences.in": read,
                                  "sieverag.sentences.kept": kept,
                                  "sieverag.documents.kept": len(result.kept)})
            return result
