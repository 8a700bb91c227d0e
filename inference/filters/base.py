"""The interface every document filter shares: question + documents in, kept documents out."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sieverag.inference.types import Document


@dataclass(frozen=True)
class ScoredDocument:
    """A document with the filter's score for it and whether it was kept.

    `details` holds filter-specific evidence (e.g. the judge's predicted answer).
    """

    document: Document
    score: float
    kept: bool
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class FilterResult:
    """Kept documents in reading order (best first), every score, and the threshold used."""

    kept: tuple[ScoredDocument, ...]
    scored: tuple[ScoredDocument, ...]
    threshold: float | None

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
