"""The interface every document filter shares: question + documents in, kept documents out;
and how a scored document is stored in result records and traces (`ScoredDocumentRecord`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pydantic import Field

from sieverag.inference.core.io_utils import JsonlRecord
from sieverag.inference.core.types import Document


@dataclass(frozen=True)
class ScoredDocument:
    """A document with the filter's score for it and whether it was kept.

    `details` holds filter-specific evidence (e.g. the judge's predicted answer).
    """

    document: Document
    score: float
    kept: bool
    details: dict = field(default_factory=dict)


class ScoredDocumentRecord(JsonlRecord):
    """A scored document as records store it: the filter's score and verdict, then the
    filter's `details` flattened beside them (each detail key a filter writes is a field
    here; a filter that adds one adds it here too). A detail a filter did not write is
    absent from the stored entry (None here)."""

    id: str = Field(description="the document's id")
    title: str | None = Field(None, description="the document's title (amber's rounds only)")
    score: float = Field(description="the filter's score (MCF: its rule's, by default the "
                                     "combined logit; "
                                     "main-rag-naive: 1.0 kept by its verdict, 0.0 dropped)")
    kept: bool = Field(description="whether the filter kept the document")
    is_gold: bool | None = Field(description="the data's gold mark; None where unmarked")
    p_yes: float | None = Field(None, description="MCF: P(Yes) of the chunk question")
    filter_score: float | None = Field(None, description="MCF: the filter's s = log P(Yes) "
                                                         "− log P(No), before any combination")
    bm25: float | None = Field(None, description="MCF: BM25 of the question, over the round")
    dense: float | None = Field(None, description="MCF: cosine of question and passage "
                                                  "embeddings")
    p_relevant: float | None = Field(None, description="MCF: P(relevant) of the combination "
                                                       "(calibrated where `calibrated`)")
    calibrated: bool | None = Field(None, description=(
        "MCF: whether p_relevant is a calibrated probability (the card's fitted combination, "
        "on a round its shift guard finds like the fitting rounds); false: a relevance score "
        "in [0, 1], not a probability"))
    mcf_score: float | None = Field(None, description="stack: MCF's score")
    mcf_kept: bool | None = Field(None, description="stack: MCF's verdict")
    mcf_threshold: float | None = Field(None, description="stack: MCF's bar")
    judge_score: float | None = Field(None, description="stack: the judge's score")
    judge_kept: bool | None = Field(None, description="stack: the judge's verdict")
    judge_threshold: float | None = Field(None, description="stack: the judge's bar")
    predicted_answer: str | None = Field(None, description="judge: the predictor's answer")
    verdict: str | None = Field(None, description="main-rag-naive: Agent-2's generated reply")
    sentence_reply: str | None = Field(None, description="MCF: the sentence stage's reply")
    sentence_status: Literal["single", "parsed", "unparsed", "none", "none_dropped"] | None = \
        Field(None, description="MCF: how the key sentences were chosen")
    key_sentences: list[int] | None = Field(None, description="MCF: 0-based key sentences")
    sentence_scores: list[float | None] | None = Field(None, description=(
        "MCF, one-pass filter: each sentence's s from the same pass (None: cut by the "
        "context)"))
    window: list[int] | None = Field(None, description=(
        "MCF, a document longer than the filter's window: [start, end), the character "
        "offsets of the best read window, whose scores are the document's"))
    windows: int | None = Field(None, description=(
        "MCF: the document's windows, where it has several or none (0: blank, not read)"))
    windows_read: int | None = Field(None, description="MCF: the windows the filter read")


@dataclass(frozen=True)
class FilterResult:
    """Kept documents in reading order (best first; the judge's in `judge.order`), every
    score, and the threshold used."""

    kept: tuple[ScoredDocument, ...]
    scored: tuple[ScoredDocument, ...]
    threshold: float | None
    rule: str | None = None
    """Which rule set the threshold (MCF: calibrated, shift_guard, top_k, fixed, adaptive)."""
    rule_reason: str | None = None
    """Why, in words (MCF's calibrated bar: the P(relevant) bar, or what the shift guard
    found unlike the fitting rounds)."""
    calibrated: bool | None = None
    """MCF: whether the round's P(relevant) (each score's `p_relevant`) is a calibrated
    probability (`Combination.calibrated_on`: the card's fitted combination, on a round its
    shift guard finds like the fitting rounds); False: a relevance score only (`rule_reason`
    says what was unlike). None: the filter gives no P(relevant)."""

    @property
    def kept_documents(self) -> list[Document]:
        return [s.document for s in self.kept]


class DocumentFilter(Protocol):
    """Decides which documents a generator reads."""

    name: str

    def select(self, question: str, documents: Sequence[Document]) -> FilterResult: ...


class KeepAll:
    """The `none` filter: every document is kept, in the given order."""

    name = "none"

    def select(self, question: str, documents: Sequence[Document]) -> FilterResult:
        scored = tuple(ScoredDocument(d, 0.0, True) for d in documents)
        return FilterResult(kept=scored, scored=scored, threshold=None)


FilterFactory = Callable[..., DocumentFilter]


def z_scores(values: Sequence[float]) -> list[float]:
    """(x − mean) / σ over `values` (population σ); all zeros when σ = 0."""
    mean, sigma = statistics.fmean(values), statistics.pstdev(values)
    return [(v - mean) / sigma if sigma > 0 else 0.0 for v in values]
