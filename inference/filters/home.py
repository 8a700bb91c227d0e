"""The filter's home: the kind of text a trained filter was trained on, where it reads better
than retrieval, and a test of whether a round looks like it (issue 65).

A small trained filter earns its place on its own kind of text and is noise elsewhere. A card
whose filter helps at home holds a `home` section beside its `combination` (the away
default, chosen leave-one-source-out; the card's sections are read and written by
`card/combination.py`):

* `HomeTest` — P(home) of a round, read from retrieval's features alone before the filter is
  called: a logistic regression on the question's embedding, the mean embedding of the
  round's passages and the log of the question's length in words, fitted on rounds of the
  filter's training sources against rounds of other sources. Its `bar` is chosen so that no
  other source, left out of the test's fit in turn, loses against the away default
  (`training/evaluation/home_fit.py`): a round is home only where the test is sure.
* the home `Combination` — the filter's score with BM25 and dense, fitted on the home
  sources' validation rounds as MCF reads them at home, with its own calibrated bar, min_keep
  and shift guard.
* `read` — a home round's filter reads only the passages the priors cannot rule out: the
  `read` best by z(BM25) + z(dense) (`home_reading`); the others are not kept.

MCF (`mcf.home`: auto, home, away) asks `HomeRule.decide` first; the rule used, the test's
value and its bar are in every round's `rule` and `rule_reason`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from sieverag.inference.filters.document_filter import z_scores
from sieverag.inference.filters.embeddings import DEFAULT_EMBEDDING_MODEL, round_vectors

# question, passage texts, embedding model → unit vectors, the question's first
RoundVectors = Callable[[str, Sequence[str], str], np.ndarray]
DEFAULT_HOME_READ = 5  # passages a home round's filter reads: the priors' best
HomeMode = Literal["auto", "home", "away"]
HOME_MODES: tuple[str, ...] = ("auto", "home", "away")


def home_features(question: str, vectors: np.ndarray) -> np.ndarray:
    """What the home test reads of a round: the question's unit embedding (`vectors[0]`), the
    mean of its passages' (`vectors[1:]`; zeros without passages) and log(1 + the question's
    words)."""
    passages = vectors[1:].mean(axis=0) if len(vectors) > 1 else np.zeros(vectors.shape[1])
    return np.concatenate([vectors[0], passages, [math.log1p(len(question.split()))]])


@dataclass(frozen=True)
class HomeTest:
    """P(home) = σ(bias + weights · `home_features`); a round is home at P(home) ≥ `bar`."""

    weights: tuple[float, ...]
    bias: float
    bar: float
    embedding_model: str = DEFAULT_EMBEDDING_MODEL
    dataset_bar: float | None = None
    """A whole dataset is home where its rounds' mean P(home) reaches this (None: no
    dataset decision; see `dataset_decision`)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.bar <= 1.0:
            raise ValueError(f"the home test's bar must be in (0, 1], got {self.bar}")
        if self.dataset_bar is not None and not 0.0 < self.dataset_bar < 1.0:
            raise ValueError(f"the home test's dataset bar must be in (0, 1), got "
                             f"{self.dataset_bar}")

    def probability_of(self, features: np.ndarray) -> float:
        """P(home) of a round's `home_features`."""
        if len(features) != len(self.weights):
            raise ValueError(f"the home test reads {len(self.weights)} features, got "
                             f"{len(features)} (another embedding model?)")
        logit = self.bias + float(np.dot(self.weights, features))
        return 1.0 / (1.0 + math.exp(-max(min(logit, 50.0), -50.0)))

    def probability(self, question: str, texts: Sequence[str],
                    vectors: RoundVectors = round_vectors) -> float:
        """P(home) of a round: `question` and its passages' `texts`, embedded by `vectors`."""
        return self.probability_of(home_features(
            question, vectors(question, texts, self.embedding_model)))

    def as_card(self) -> dict[str, Any]:
        return {"features": "question embedding, mean passage embedding, log(1 + words)",
                "embedding_model": self.embedding_model, "bias": round(self.bias, 6),
                "bar": self.bar, "dataset_bar": self.dataset_bar,
                "weights": [round(w, 6) for w in self.weights]}

    @classmethod
    def from_card(cls, section: Mapping[str, Any]) -> HomeTest:
        dataset_bar = section.get("dataset_bar")
        return cls(tuple(float(w) for w in section["weights"]), float(section["bias"]),
                   float(section["bar"]),
                   str(section.get("embedding_model", DEFAULT_EMBEDDING_MODEL)),
                   None if dataset_bar is None else float(dataset_bar))


@dataclass(frozen=True)
class HomeDecision:
    """Which combination ranks a round, and why."""

    home: bool
    p_home: float | None
    """The test's P(home) (None: not tested, `mcf.home` decided)."""
    reason: str


@dataclass(frozen=True)
class HomeRule:
    """The card's home section: the test, the home combination, how many passages the filter
    reads at home, and the sources that are home."""

    test: HomeTest
    combination: Any
    """The home `combination.Combination` (the filter's score with BM25 and dense)."""
    read: int = DEFAULT_HOME_READ
    sources: tuple[str, ...] = ()
    report: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.read < 1:
            raise ValueError(f"the home rule's read must be >= 1, got {self.read}")

    def decide(self, question: str, texts: Sequence[str], mode: HomeMode = "auto",
               vectors: RoundVectors = round_vectors) -> HomeDecision:
        """Home or away for a round (`mcf.home`): auto tests it (its passages embedded by
        `vectors`), home and away are given."""
        where = f"the filter's home text ({', '.join(self.sources) or 'its training sources'})"
        if mode == "home":
            return HomeDecision(True, None, f"{where}, as mcf.home home says")
        if mode == "away":
            return HomeDecision(False, None, "away from the filter's home text, as mcf.home "
                                             "away says")
        p_home = self.test.probability(question, texts, vectors)
        if p_home >= self.test.bar:
            return HomeDecision(True, p_home, f"{where}: P(home) {p_home:.3f} >= "
                                              f"{self.test.bar:g}")
        return HomeDecision(False, p_home, f"away: P(home) {p_home:.3f} < {self.test.bar:g}")


def dataset_decision(rule: HomeRule, rounds: Sequence[tuple[str, Sequence[str]]],
                     name: str, vectors: RoundVectors = round_vectors
                     ) -> tuple[HomeMode, str]:
    """Home or away for a whole dataset (its rounds: question and passage texts each): home
    where the rounds' mean P(home) reaches the test's `dataset_bar`, else "auto" (each round
    tested on its own); the mode and the line that says why, naming the dataset `name`.
    A per-round test misfires on some rounds of any set; averaged over a dataset the sets
    separate cleanly."""
    if rule.test.dataset_bar is None or not rounds:
        return "auto", f"{name}: each round tested on its own (the card has no dataset bar)"
    mean = float(np.mean([rule.test.probability(q, texts, vectors) for q, texts in rounds]))
    if mean >= rule.test.dataset_bar:
        return "home", (f"{name}: the filter's home text ({', '.join(rule.sources)}): mean "
                        f"P(home) {mean:.3f} >= {rule.test.dataset_bar:g} over {len(rounds)} "
                        "questions, so every round ranks by the home rule")
    return "auto", (f"{name}: mean P(home) {mean:.3f} < {rule.test.dataset_bar:g} over "
                    f"{len(rounds)} questions, so each round is tested on its own")


def home_reading(bm25: Sequence[float], dense: Sequence[float], read: int) -> list[int]:
    """The passages a home round's filter reads: the `read` best by z(BM25) + z(dense) over
    the round (ties to the earlier), in passage order."""
    fused = [b + d for b, d in zip(z_scores(list(bm25)), z_scores(list(dense)), strict=True)]
    best = sorted(range(len(fused)), key=lambda i: (-fused[i], i))[:read]
    return sorted(best)
