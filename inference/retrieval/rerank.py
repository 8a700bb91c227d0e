"""Optional second stage: re-score the first-stage hits with a cross-encoder.

Any object with `rerank(query, hits) -> hits` fits the `HitReranker` protocol; the one provided
loads a sentence-transformers `CrossEncoder` from a local model folder (nothing is downloaded).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from sieverag.inference.core.errors import ModelNotFoundError
from sieverag.inference.retrieval.retrieved import RetrievedDocument


class HitReranker(Protocol):
    """Re-orders hits for a query; returns them best first with their new scores."""

    def rerank(self, query: str, hits: Sequence[RetrievedDocument]) -> list[RetrievedDocument]:
        ...


class CrossEncoderReranker:
    """Scores each (query, chunk text) pair with a cross-encoder from a local folder."""

    def __init__(self, model_dir: str | Path, batch_size: int = 32,
                 device: str | None = None) -> None:
        if not Path(model_dir).is_dir():
            raise ModelNotFoundError(f"cross-encoder model folder not found: {model_dir}")
        # Local folders only: keep the Hugging Face hub offline so nothing is ever fetched.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import CrossEncoder

        self.model = CrossEncoder(str(model_dir), device=device)
        self.batch_size = batch_size

    def rerank(self, query: str, hits: Sequence[RetrievedDocument]) -> list[RetrievedDocument]:
        """The same hits, scored by the cross-encoder, best first (ties keep input order)."""
        if not hits:
            return []
        scores = self.model.predict([(query, hit.document.as_context()) for hit in hits],
                                    batch_size=self.batch_size, show_progress_bar=False)
        rescored = [replace(hit, score=float(s)) for hit, s in zip(hits, scores, strict=True)]
        return sorted(rescored, key=lambda hit: -hit.score)
