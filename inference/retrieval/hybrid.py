"""Fusing a BM25 ranking and a dense ranking into one.

Both fusions work on each retriever's top candidates, as (position, score) lists, best first.

* Weighted fusion: each list's scores are min-max normalised to [0, 1] over that list
  (a list whose scores are all equal normalises to 1.0), a position missing from a list
  counts 0 there, and fused = alpha · dense + (1 − alpha) · bm25. BM25 scores are unbounded
  and dense cosines are not, which is why the raw scores are never added.
* Reciprocal-rank fusion (Cormack et al., 2009): fused = Σ over lists of 1 / (k + rank), rank
  starting at 1; k = 60 damps the advantage of the very top ranks. Scores are ignored.

Ties are broken by corpus position, so results are deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

from sieverag.inference.retrieval.retrieved import Ranking

RRF_K = 60


def min_max_normalise(ranking: Sequence[tuple[int, float]]) -> dict[int, float]:
    """{position: score scaled to [0, 1] over this list}; all-equal scores map to 1.0."""
    if not ranking:
        return {}
    scores = [score for _, score in ranking]
    low, high = min(scores), max(scores)
    if high == low:
        return {position: 1.0 for position, _ in ranking}
    return {position: (score - low) / (high - low) for position, score in ranking}


def _ranked(fused: dict[int, float]) -> Ranking:
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))


def weighted_fusion(bm25: Sequence[tuple[int, float]], dense: Sequence[tuple[int, float]],
                    alpha: float = 0.5) -> Ranking:
    """alpha · normalised dense + (1 − alpha) · normalised BM25, best first."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    bm25_norm, dense_norm = min_max_normalise(bm25), min_max_normalise(dense)
    positions = bm25_norm.keys() | dense_norm.keys()
    return _ranked({p: alpha * dense_norm.get(p, 0.0) + (1 - alpha) * bm25_norm.get(p, 0.0)
                    for p in positions})


def reciprocal_rank_fusion(rankings: Sequence[Sequence[tuple[int, float]]],
                           k: int = RRF_K) -> Ranking:
    """Σ 1 / (k + rank) over the rankings (rank 1 = best), best first."""
    if k < 0:
        raise ValueError(f"rrf k must be >= 0, got {k}")
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, (position, _) in enumerate(ranking, start=1):
            fused[position] = fused.get(position, 0.0) + 1.0 / (k + rank)
    return _ranked(fused)
