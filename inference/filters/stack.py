"""`stack`: the trained filter (MCF) and the training-free judge (MAIN-RAG) on the same chunks.

Both score every chunk of the round: MCF's s = log P("Yes") − log P("No") on the trained
filter, the judge's r = log P("Yes") − log P("No") on its (document, predicted answer)
triplet. Each keeps chunks by its own bar (MCF: `mcf.bar`; judge: τq = mean(r) − n·σ(r)).
The combination (`stack.combine`):

* `both` (default) — keep a chunk when MCF and the judge both keep it (precision first);
* `either` — keep it when either keeps it (recall first);
* `zmean` — ignore the two bars: z-normalise s and r over the round's chunks
  (z = (x − mean) / σ, σ the population standard deviation; 0 where σ = 0), keep chunks whose
  mean z-score is at least `stack.zmean_threshold` (0: above the average chunk).

Every chunk's stacked score is the mean z-score (its reading order, best first); the two raw
scores, both verdicts and the judge's predicted answer are kept in `details`. The kept chunks
then go through MCF's sentence stage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sieverag.inference.core.settings import settings
from sieverag.inference.core.types import Document
from sieverag.inference.filters.document_filter import FilterResult, ScoredDocument, z_scores
from sieverag.inference.filters.judge import MainRagJudge
from sieverag.inference.filters.mcf import MultiGranularFilter

StackCombine = Literal["both", "either", "zmean"]


@settings
class StackConfig:
    """How the `stack` filter combines MCF and the judge (see the module docstring)."""

    combine: StackCombine = field(default="both", metadata={
        "help": "both: keep when both keep; either: when either keeps; zmean: mean z-score "
                ">= zmean_threshold"})
    zmean_threshold: float = field(default=0.0, metadata={
        "help": "zmean: the bar on the mean of the two z-normalised scores"})


@dataclass(frozen=True)
class _Votes:
    mcf_kept: list[bool]
    judge_kept: list[bool]
    zmean: list[float]


def _both(votes: _Votes, config: StackConfig) -> tuple[list[bool], float | None]:
    return [a and b for a, b in zip(votes.mcf_kept, votes.judge_kept, strict=True)], None


def _either(votes: _Votes, config: StackConfig) -> tuple[list[bool], float | None]:
    return [a or b for a, b in zip(votes.mcf_kept, votes.judge_kept, strict=True)], None


def _zmean(votes: _Votes, config: StackConfig) -> tuple[list[bool], float | None]:
    return [z >= config.zmean_threshold for z in votes.zmean], config.zmean_threshold


# Each combination: both filters' votes → (keep flags, the threshold to record).
COMBINATIONS: dict[str, Callable[[_Votes, StackConfig], tuple[list[bool], float | None]]] = {
    "both": _both,
    "either": _either,
    "zmean": _zmean,
}


class StackedFilter:
    """The `stack` filter: MCF's chunk stage and the judge, combined, then MCF's sentences."""

    name = "stack"

    def __init__(self, mcf: MultiGranularFilter, judge: MainRagJudge,
                 config: StackConfig | None = None) -> None:
        self.mcf = mcf
        self.judge = judge
        self.config = config if config is not None else StackConfig()

    def select(self, question: str, documents: Sequence[Document]) -> FilterResult:
        if not documents:
            return FilterResult(kept=(), scored=(), threshold=None)
        chunks = self.mcf.chunk_stage(question, documents)
        judged = self.judge.select(question, documents)
        votes = _Votes(mcf_kept=[s.kept for s in chunks.scored],
                       judge_kept=[s.kept for s in judged.scored],
                       zmean=[(a + b) / 2 for a, b in zip(
                           z_scores([s.score for s in chunks.scored]),
                           z_scores([s.score for s in judged.scored]), strict=True)])
        keep, threshold = COMBINATIONS[self.config.combine](votes, self.config)
        scored = tuple(
            ScoredDocument(m.document, z, k, {
                **m.details, "mcf_score": m.score, "mcf_kept": m.kept,
                "mcf_threshold": chunks.threshold, "judge_score": j.score,
                "judge_kept": j.kept, "judge_threshold": judged.threshold, **j.details})
            for m, j, z, k in zip(chunks.scored, judged.scored, votes.zmean, keep, strict=True))
        kept = tuple(sorted((s for s in scored if s.kept), key=lambda s: -s.score))
        stacked = FilterResult(kept=kept, scored=scored, threshold=threshold)
        if not self.mcf.config.sentence_stage or not kept:
            return stacked
        return self.mcf.narrow(question, stacked)
