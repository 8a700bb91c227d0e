"""Retrieval evaluation against a known gold source document per question.

Hits are chunks; they are mapped to their source document and de-duplicated (first rank
wins), so a paragraph split into several chunks counts once. For each question:

* recall@k = 1 if the gold source is among the first k distinct sources, else 0;
* reciprocal rank = 1 / rank of the gold source within the first `depth` hits (0 if absent).

Reported values are means over the questions; MRR is therefore MRR@depth.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sieverag.inference.core.types import Example
from sieverag.inference.retrieval.index_folder import Index, SearchMode
from sieverag.inference.retrieval.retrieved import RetrievedDocument

T = TypeVar("T")


@dataclass(frozen=True)
class RetrievalScores:
    """One mode's results over a question set."""

    mode: str
    questions: int
    recall: dict[int, float]
    mrr: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "questions": self.questions,
                **{f"recall@{k}": round(v, 4) for k, v in self.recall.items()},
                "mrr": round(self.mrr, 4), "seconds": round(self.seconds, 2),
                "queries_per_s": round(self.questions / max(self.seconds, 1e-9), 1)}


def ranked_sources(hits: Sequence[RetrievedDocument]) -> list[str]:
    """Source ids of the hits in rank order, each kept at its first rank."""
    return list(dict.fromkeys(hit.source_id for hit in hits))


def recall_at_k(sources: Sequence[str], gold: str, k: int) -> float:
    """1.0 if `gold` is among the first k sources, else 0.0."""
    return 1.0 if gold in sources[:k] else 0.0


def reciprocal_rank(sources: Sequence[str], gold: str) -> float:
    """1 / (1-based rank of `gold`), or 0.0 when it is absent."""
    return 1.0 / (sources.index(gold) + 1) if gold in sources else 0.0


def spread_subset(items: Sequence[T], limit: int | None) -> list[T]:
    """`limit` items spread evenly over `items` (all of them when limit is None or larger)."""
    if limit is None or limit >= len(items):
        return list(items)
    return [items[i * len(items) // limit] for i in range(limit)]


def evaluate_retrieval(index: Index, examples: Sequence[Example], modes: Sequence[SearchMode],
                       ks: Sequence[int] = (1, 5, 20), depth: int = 100,
                       show_progress: bool = True) -> list[RetrievalScores]:
    """Recall@k and MRR@depth per mode; each example needs `metadata["gold_doc_id"]`."""
    questions = [example.question for example in examples]
    golds = [str(example.metadata["gold_doc_id"]) for example in examples]
    depth = max(depth, *ks)
    results = []
    for mode in modes:
        start = time.perf_counter()
        all_hits = index.iter_search(questions, depth, mode, show_progress=show_progress)
        seconds = time.perf_counter() - start
        sources = [ranked_sources(hits) for hits in all_hits]
        count = max(len(examples), 1)
        recall = {k: sum(recall_at_k(s, g, k) for s, g in zip(sources, golds, strict=True))
                  / count for k in ks}
        mrr = sum(reciprocal_rank(s, g) for s, g in zip(sources, golds, strict=True)) / count
        results.append(RetrievalScores(mode, len(examples), recall, mrr, seconds))
    return results


def format_table(scores: Sequence[RetrievalScores]) -> str:
    """A fixed-width table: one row per mode, recall@k columns, MRR, queries/s."""
    if not scores:
        return ""
    ks = list(scores[0].recall)
    header = ["mode", *[f"R@{k}" for k in ks], "MRR", "queries/s"]
    rows = [[s.mode, *[f"{s.recall[k]:.3f}" for k in ks], f"{s.mrr:.3f}",
             f"{s.questions / max(s.seconds, 1e-9):.0f}"] for s in scores]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(r, widths, strict=True))) for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
