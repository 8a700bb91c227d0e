"""What a search returns: a chunk as an `inference.types.Document`, with its score."""

from __future__ import annotations

from dataclasses import dataclass

from sieverag.inference.core.types import Document

# (corpus position, score) pairs, best first: the currency between retrievers and fusion.
Ranking = list[tuple[int, float]]


@dataclass(frozen=True)
class RetrievedDocument:
    """One search hit: the chunk as a Document (id = chunk id), its score and its source id."""

    document: Document
    score: float
    source_id: str

    @property
    def text(self) -> str:
        return self.document.text
