"""Fitting a filter card's home rule (`inference/filters/home.py`): the home combination, the
home test and its bar, chosen so that no other source loses (issue 65).

The rounds: the fitting questions of the filter's home sources (its training sources, by
default the card's `dataset.sources.train`), scored by the filter, and rounds of other sources
("away"). An away round needs its passages' filter scores only where the home test would call
it home, so away rounds are scored lazily (`AwayRound.scored`): the test comes first, on
retrieval's features alone, as in MCF.

* **The home combination** — the filter's score with BM25 and dense, fitted on the home
  rounds as MCF reads them at home: each round cut to the priors' best `read` passages
  (`home.home_reading`), BM25 over those. Its rule (min_keep, guard, top_k) is the
  with-filter candidate of `combination_fit.CANDIDATES` with the best mean F1 over K folds of
  home questions, F1 counted against every gold passage of the round (one the filter did not
  read is missed).
* **The home test** — a logistic regression on `home.home_features` (question embedding,
  mean passage embedding, log question length), home rounds against away rounds. Each
  round's P(home) is out of fit: an away source's from a test fitted without that source, a
  home round's from K folds over home questions.
* **The bar** — going down `BAR_GRID` from the surest bar, the last before the first at which
  some away source, left out of the test in turn, loses more than `tolerance` F1 against the
  away default (rounds called home there rank by the home rule, the rest as today); bars
  below that one are not measured (their away rounds are never scored). The home source's
  gain at each bar is reported beside each away source's loss.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.core.types import Example
from sieverag.inference.filters.card.combination import (
    DEFAULT_EMBEDDING_MODEL,
    Combination,
    RoundScores,
    passage_priors,
)
from sieverag.inference.filters.embeddings import round_vectors
from sieverag.inference.filters.home import (
    DEFAULT_HOME_READ,
    HomeRule,
    HomeTest,
    home_features,
    home_reading,
)
from sieverag.inference.metrics.filter_scores import auroc, decision_quality
from sieverag.training.evaluation.combination_fit import (
    CANDIDATES,
    LabelledRound,
    SelectionRule,
    fit_rule,
)
from sieverag.training.evaluation.fit_defaults import DEFAULT_TOLERANCE

BAR_GRID = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.97, 0.99)
FOLDS = 5


@dataclass(frozen=True)
class HomeRound:
    """A home question: its filter-scored round and its passages' texts."""

    example: Example
    scored: LabelledRound


@dataclass
class AwayRound:
    """A round of another source: its question and passages (None for a reference round kept
    as features only), and how to score it with the filter when the test calls it home."""

    source: str
    features: np.ndarray
    example: Example | None = None
    score: Callable[[Example], LabelledRound] | None = None
    _scored: LabelledRound | None = None

    def scored(self) -> LabelledRound:
        if self._scored is None:
            if self.example is None or self.score is None:
                raise DatasetError(f"a reference round of {self.source} has no passages to "
                                   "score")
            self._scored = self.score(self.example)
        return self._scored


def round_features(example: Example, embedding_model: str = DEFAULT_EMBEDDING_MODEL
                   ) -> np.ndarray:
    """`home_features` of a question's round (its non-blank passages)."""
    texts = [d.as_context() for d in example.documents if d.text.strip()]
    return home_features(example.question, round_vectors(example.question, texts,
                                                         embedding_model))


# ----- the home combination -----------------------------------------------------------------


@dataclass(frozen=True)
class ReadRound:
    """A round as MCF reads it at home: the passages read (`read`, positions in the round),
    their scores (BM25 over them), and the round's gold positions (read or not)."""

    read: tuple[int, ...]
    scores: RoundScores
    gold: frozenset[int]
    source: str


def read_round(example: Example, scored: LabelledRound, read: int,
               embedding_model: str = DEFAULT_EMBEDDING_MODEL) -> ReadRound:
    """`scored` (the whole round's scores) cut to what a home round's filter reads."""
    chosen = home_reading(scored.scores.bm25, scored.scores.dense, read)
    texts = [example.documents[i].as_context() for i in chosen]
    bm25, dense = passage_priors(example.question, texts, embedding_model)
    return ReadRound(tuple(chosen),
                     RoundScores(tuple(scored.scores.filter_log_odds[i] for i in chosen),
                                 tuple(bm25), tuple(dense)),
                     frozenset(i for i, g in enumerate(scored.labels) if g), scored.source)


def _labelled(rounds: Sequence[ReadRound]) -> list[LabelledRound]:
    return [LabelledRound(r.scores, tuple(i in r.gold for i in r.read), r.source)
            for r in rounds]


def kept_at_home(combination: Combination, round_: ReadRound) -> set[int]:
    """The round's passages the home rule keeps (positions in the whole round)."""
    logits = combination.logits(round_.scores)
    bar = combination.round_bar(round_.scores).bar
    return {round_.read[j] for j, v in enumerate(logits) if v >= bar}


def kept_away(combination: Combination, scored: LabelledRound) -> set[int]:
    """What the away default keeps of a whole round (MCF's calibrated bar)."""
    logits = combination.logits(scored.scores)
    bar = combination.round_bar(scored.scores).bar
    return {i for i, v in enumerate(logits) if v >= bar}


def f1_of(kept: set[int], gold: set[int] | frozenset[int]) -> float:
    return decision_quality([(set(kept), set(gold))])["f1"] or 0.0


def fit_home_combination(rounds: Sequence[ReadRound], *, folds: int = FOLDS, seed: int = 0
                         ) -> tuple[Combination, list[float], dict[str, Any]]:
    """The with-filter rule of `CANDIDATES` with the best mean out-of-fold F1 on `rounds`
    (against every gold passage), fitted on all of them; each round's out-of-fold F1 under
    that rule; and what was measured."""
    if len(rounds) < folds:
        raise DatasetError(f"fitting the home combination needs at least {folds} home "
                           f"questions, got {len(rounds)}")
    order = list(range(len(rounds)))
    random.Random(seed).shuffle(order)
    fold_of = {index: position % folds for position, index in enumerate(order)}
    labelled = _labelled(rounds)
    out_of_fold: dict[SelectionRule, list[float]] = {}
    for rule in (r for r in CANDIDATES if r.features == "with_filter"):
        f1s = [0.0] * len(rounds)
        try:
            for fold in range(folds):
                fitted = fit_rule(rule, [labelled[i] for i in range(len(rounds))
                                         if fold_of[i] != fold])
                for i in range(len(rounds)):
                    if fold_of[i] == fold:
                        f1s[i] = f1_of(kept_at_home(fitted, rounds[i]), rounds[i].gold)
        except DatasetError:
            continue
        out_of_fold[rule] = f1s
    if not out_of_fold:
        raise DatasetError("no home combination could be fitted: the home questions need "
                           "relevant and irrelevant passages among those the filter reads")
    rule = max(out_of_fold, key=lambda r: (round(float(np.mean(out_of_fold[r])), 9),
                                           -r.min_keep))
    return fit_rule(rule, labelled), out_of_fold[rule], {
        "rule": rule.as_card(), "cross_validated_f1": float(np.mean(out_of_fold[rule])),
        "questions": len(rounds), "gold_read": sum(len(r.gold & set(r.read)) for r in rounds),
        "gold": sum(len(r.gold) for r in rounds)}


# ----- the home test ------------------------------------------------------------------------


def fit_test(home: np.ndarray, away: np.ndarray) -> tuple[np.ndarray, float]:
    """The logistic regression of home (1) against away (0) rounds' features, classes
    weighted equally; its weights and bias."""
    from sklearn.linear_model import LogisticRegression

    x = np.vstack([home, away])
    y = np.concatenate([np.ones(len(home)), np.zeros(len(away))])
    model = LogisticRegression(C=1.0, max_iter=2000, class_weight="balanced").fit(x, y)
    return model.coef_[0], float(model.intercept_[0])


def _p(weights: np.ndarray, bias: float, x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x @ weights + bias, -50, 50)))


def out_of_fit_p_home(home: np.ndarray, away: Sequence[AwayRound], *, folds: int = FOLDS,
                      seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Each round's P(home) from a test that did not see it: a home round's from K folds over
    home rounds (every away round in each fit), an away source's from a test fitted on every
    other source."""
    order = list(range(len(home)))
    random.Random(seed).shuffle(order)
    fold_of = np.array([0] * len(home))
    for position, index in enumerate(order):
        fold_of[index] = position % folds
    away_x = np.vstack([r.features for r in away])
    home_p = np.zeros(len(home))
    for fold in range(folds):
        weights, bias = fit_test(home[fold_of != fold], away_x)
        home_p[fold_of == fold] = _p(weights, bias, home[fold_of == fold])
    by_source: dict[str, np.ndarray] = {}
    for source in sorted({r.source for r in away}):
        inside = np.array([r.source == source for r in away])
        weights, bias = fit_test(home, away_x[~inside])
        by_source[source] = _p(weights, bias, away_x[inside])
    return home_p, by_source


# ----- the whole rule -----------------------------------------------------------------------


def fit_home_rule(home: Sequence[HomeRound], away: Sequence[AwayRound],
                  away_combination: Combination, *, sources: Sequence[str],
                  read: int = DEFAULT_HOME_READ, tolerance: float = DEFAULT_TOLERANCE,
                  embedding_model: str = DEFAULT_EMBEDDING_MODEL,
                  folds: int = FOLDS) -> HomeRule:
    """The home rule (see the module docstring): the home combination, the test fitted on
    every round, its bar chosen on out-of-fit P(home), and the table that chose it."""
    if not away:
        raise DatasetError("fitting a home rule needs rounds of other sources (away) to tell "
                           "home from")
    reads = [read_round(h.example, h.scored, read, embedding_model) for h in home]
    combination, home_f1, combination_report = fit_home_combination(reads, folds=folds)
    home_x = np.vstack([round_features(h.example, embedding_model) for h in home])
    home_p, away_p = out_of_fit_p_home(home_x, away, folds=folds)

    # Home rounds: F1 at home (the home combination out of fold) and under the away default.
    home_away_f1 = [f1_of(kept_away(away_combination, h.scored),
                          {i for i, g in enumerate(h.scored.labels) if g}) for h in home]
    rows: list[dict[str, Any]] = []
    chosen: dict[str, Any] | None = None
    # From the surest bar down: the bar is the lowest of an unbroken run of bars that keep
    # every away source whole from the top; below the first that does not, nothing is
    # measured (no away round scored for it).
    for bar in sorted(BAR_GRID, reverse=True):
        row: dict[str, Any] = {"bar": bar, "sources": {}}
        fires = home_p >= bar
        row["home"] = {
            "questions": len(home), "called_home": float(fires.mean()),
            "f1_away_only": float(np.mean(home_away_f1)),
            "f1": float(np.mean([h if f else a for h, a, f
                                 in zip(home_f1, home_away_f1, fires, strict=True)]))}
        fine = True
        for source, p in away_p.items():
            rounds = [r for r in away if r.source == source]
            called = [r for r, value in zip(rounds, p, strict=True) if value >= bar]
            loss = _loss(called, away_combination, combination, read, embedding_model,
                         len(rounds))
            row["sources"][source] = {"questions": len(rounds),
                                      "called_home": len(called) / len(rounds),
                                      "f1_loss": loss}
            fine &= loss is not None and loss <= tolerance + 1e-9
        row["meets"] = fine
        rows.insert(0, row)
        if not fine:
            break
        chosen = row
    if chosen is None:  # no bar keeps every away source whole: the test never calls home
        chosen = {"bar": 1.0}
    # A dataset: home where its mean P(home) reaches halfway between the home questions'
    # out-of-fit mean and the highest away source's; none where they do not separate.
    means = {"home": float(home_p.mean()), **{s: float(p.mean()) for s, p in away_p.items()}}
    highest_away = max(v for s, v in means.items() if s != "home")
    dataset_bar = ((means["home"] + highest_away) / 2 if means["home"] > highest_away
                   else None)
    weights, bias = fit_test(home_x, np.vstack([r.features for r in away]))
    test = HomeTest(tuple(float(w) for w in weights), bias, float(chosen["bar"]),
                    embedding_model, dataset_bar)
    labels = [1] * len(home) + [0] * sum(len(p) for p in away_p.values())
    report = {"fit": {**combination_report, "tolerance": tolerance,
                      "test_auroc_out_of_fit": auroc(
                          labels, [*home_p, *(v for p in away_p.values() for v in p)]),
                      "away_questions": {s: len(p) for s, p in away_p.items()},
                      "mean_p_home_out_of_fit": means,
                      "bars": rows}}
    return HomeRule(test, replace(combination, embedding_model=embedding_model,
                                  report={}), read, tuple(sources), report)


def _loss(called: Sequence[AwayRound], away: Combination, home: Combination, read: int,
          embedding_model: str, total: int) -> float | None:
    """The F1 an away source loses (mean over its `total` rounds) where the rounds `called`
    home rank by the home rule instead of the away default; None where a called round has no
    passages to score (a reference round)."""
    if not called:
        return 0.0
    if any(r.example is None for r in called):
        return None
    difference = 0.0
    for r in called:
        scored = r.scored()
        assert r.example is not None
        gold = {i for i, g in enumerate(scored.labels) if g}
        at_home = kept_at_home(home, read_round(r.example, scored, read, embedding_model))
        difference += f1_of(kept_away(away, scored), gold) - f1_of(at_home, gold)
    return difference / total
