"""MCF's default score: the trained filter's log-odds combined with the retrieval priors (BM25
and dense similarity) of the same passages, by a logistic regression fitted on held-out
questions and stored in the adapter's card.

One implementation, used by MCF (`MultiGranularFilter`), `/v1/rerank` (through
`filters.ranking`) and `eval-filter`:

* `RoundScores` — one round's passages (one question's documents): the filter's
  s = log P(Yes) − log P(No), BM25 of the question against the round's passages (IDF over the
  round) and the cosine of question and passage embeddings (`embedding_model`).
* `round_features` — what the regression reads per passage (`FEATURES`): s clipped to ±20, s
  z-scored over the round, BM25 z-scored over the round, the cosine, the cosine z-scored over
  the round. The absolute features carry calibration across rounds; the z-scored ones carry
  the ranking within a round.
* `Combination` — weights per feature and a bias: logit = bias + Σ w·feature, and
  P(relevant) = p_relevant(logit), a calibrated probability (Platt scaling by construction: the
  regression is fitted on labelled passages) when the combination was fitted (`fitted`).
* `probability_bar` — the default bar on the combined logit: keep P(relevant) ≥ the bar, and
  at least `min_keep` passages (the best), so a round whose relevant passages are several
  keeps them all and no round is emptied unless `min_keep` is 0.

A trained filter's card without a fitted combination (`sieverag train` fits one on its
validation split; where it could not, or a card written before it did) gets `FILTER_ALONE`:
the filter's own s, so P(relevant) is its normalised P(Yes); not fitted on labelled passages
(`fitted` False), so MCF's calibrated bar falls back to its top_k bar. `PRIORS_ONLY`,
z(BM25) + z(dense) with the filter's score unused, is what ranks where there is no card at all
or retrieval is asked for by name (`--models.filter-card retrieval-only`). Every command that
ranks by a filter says at start which of these ranks, and why (`filter_card.ranking_statement`).

The card's sections are read and written here alone: `combination` (`card_combination`,
`with_combination`, `fitted_questions`) and `home` (`card_home_rule`, `with_home`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from sieverag.inference.filters.adapter_files import AdapterError
from sieverag.inference.filters.card.card_file import read_card
from sieverag.inference.filters.document_filter import z_scores
from sieverag.inference.filters.embeddings import DEFAULT_EMBEDDING_MODEL, round_vectors
from sieverag.inference.filters.filter_format import FilterFormat, card_format, p_relevant
from sieverag.inference.filters.home import DEFAULT_HOME_READ, HomeRule, HomeTest
from sieverag.inference.filters.windows import DEFAULT_WINDOW_TOKENS, card_window_tokens

FEATURES = ("filter_log_odds", "filter_z", "bm25_z", "dense", "dense_z")
PRIOR_FEATURES = ("bm25_z", "dense", "dense_z")
FILTER_FEATURES = ("filter_log_odds", "filter_z")
COMBINATION_KEY = "combination"  # the card's section of the fitted combination
HOME_KEY = "home"  # the card's section of the home rule (`filters.home`)
# The fit report's key saying why a fitted combination holds the filter's score alone.
FILTER_ALONE_FIT = "filter_alone_because"
PRIORS_ONLY_KEY = "priors_only"  # the card section's fit of BM25 and dense alone
# What a card keeps of a fit nested in another section: its rule, not its report.
RULE_KEYS = ("weights", "bias", "bar", "min_keep", "top_k", "shift_guard")
# s beyond ±20 says nothing more (and the backends' ±1e6 floors would swamp the weights).
LOG_ODDS_CLIP = 20.0
DEFAULT_P_MIN = 0.5  # the calibrated bar where neither the settings nor the card give one


@dataclass(frozen=True)
class RoundScores:
    """The per-passage signals of one round (one question's passages), in passage order."""

    filter_log_odds: tuple[float, ...]
    bm25: tuple[float, ...]
    dense: tuple[float, ...]

    def __post_init__(self) -> None:
        if not len(self.filter_log_odds) == len(self.bm25) == len(self.dense):
            raise ValueError("filter_log_odds, bm25 and dense need one value per passage")


def round_features(scores: RoundScores) -> np.ndarray:
    """The regression's inputs: one row per passage, one column per name in `FEATURES`."""
    if not scores.filter_log_odds:
        return np.zeros((0, len(FEATURES)))
    clipped = np.clip(np.asarray(scores.filter_log_odds, dtype=float), -LOG_ODDS_CLIP,
                      LOG_ODDS_CLIP)
    dense = np.asarray(scores.dense, dtype=float)
    columns = {"filter_log_odds": clipped, "filter_z": _z(clipped),
               "bm25_z": _z(np.asarray(scores.bm25, dtype=float)), "dense": dense,
               "dense_z": _z(dense)}
    return np.column_stack([columns[name] for name in FEATURES])


def _z(values: np.ndarray) -> np.ndarray:
    """`document_filter.z_scores` (MCF's z-normalisation over a round) as an array."""
    return np.asarray(z_scores(values.tolist()), dtype=float)


def logit_of(probability: float) -> float:
    """The log-odds of a probability in (0, 1)."""
    return math.log(probability / (1.0 - probability))


SHIFT_STATISTICS = ("passages", "dense_mean", "dense_spread", "agreement", "best_p")
"""What the shift guard compares with the fitting rounds: the round's size, its passages'
mean cosine with the question and their spread, whether BM25 and dense agree on the order
(Spearman), and the best P(relevant)."""


def round_statistics(scores: RoundScores, probabilities: Sequence[float]) -> dict[str, float]:
    """One round's `SHIFT_STATISTICS`."""
    dense = np.asarray(scores.dense, dtype=float)
    return {"passages": float(len(dense)),
            "dense_mean": float(dense.mean()) if len(dense) else 0.0,
            "dense_spread": float(dense.std()) if len(dense) else 0.0,
            "agreement": _spearman(scores.bm25, scores.dense),
            "best_p": max(probabilities, default=0.0)}


def _spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Rank correlation of two scorings of the same passages (1 where fewer than 3, or a
    scoring gives every passage the same value: nothing to disagree on)."""
    if len(a) < 3:
        return 1.0
    ranks = [np.argsort(np.argsort(np.asarray(v, dtype=float), kind="stable")) for v in (a, b)]
    if ranks[0].std() == 0 or ranks[1].std() == 0 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return 1.0
    return float(np.corrcoef(ranks[0], ranks[1])[0, 1])


@dataclass(frozen=True)
class ShiftGuard:
    """When a round looks unlike those the bar was fitted on, the bar cannot be trusted there:
    each of `SHIFT_STATISTICS` has the range of its central `1 - 2·level` share over the
    fitting rounds, and a round with any statistic outside its range is unlike them."""

    ranges: Mapping[str, tuple[float, float]]
    level: float

    @classmethod
    def fit(cls, rows: Sequence[Mapping[str, float]], level: float) -> ShiftGuard:
        """The ranges of the fitting rounds' statistics (`round_statistics` of each)."""
        return cls({name: (float(np.quantile([r[name] for r in rows], level)),
                           float(np.quantile([r[name] for r in rows], 1.0 - level)))
                    for name in SHIFT_STATISTICS}, level)

    def unlike(self, statistics: Mapping[str, float]) -> list[str]:
        """The statistics of a round outside their fitted range, each as 'name value
        (range lo..hi)'."""
        return [f"{name} {statistics[name]:.3g} (fitted {lo:.3g}..{hi:.3g})"
                for name, (lo, hi) in self.ranges.items()
                if not lo - 1e-9 <= statistics[name] <= hi + 1e-9]

    def as_card(self) -> dict[str, Any]:
        return {"level": self.level, "ranges": {k: list(v) for k, v in self.ranges.items()}}

    @classmethod
    def from_card(cls, section: Mapping[str, Any]) -> ShiftGuard:
        ranges = {str(k): (float(v[0]), float(v[1])) for k, v in section["ranges"].items()}
        unknown = set(ranges) - set(SHIFT_STATISTICS)
        if unknown:
            raise ValueError(f"unknown shift statistics {sorted(unknown)}")
        return cls(ranges, float(section["level"]))


@dataclass(frozen=True)
class RoundBar:
    """The bar a round's combined logits were cut at, and which rule set it and why."""

    bar: float
    rule: str
    """calibrated (P(relevant) >= the bar, at least min_keep) or shift_guard (the round was
    unlike the fitting rounds: at least retrieval's top_k kept)."""
    reason: str


def guard_keeps(top_k: int, passages: int) -> int:
    """How many passages the shift guard keeps at least in a round of `passages`: retrieval's
    `top_k`, but never more than half the round (at least one), so a round of two or three
    still lets the bar drop the passages it ranks last."""
    return min(top_k, max(1, passages // 2))


def round_bar(logits: Sequence[float], probability: float, min_keep: int, top_k: int,
              unlike: Sequence[str] = ()) -> RoundBar:
    """The calibrated bar of one round (`probability_bar`); where the round is `unlike` the
    fitting rounds (the shift guard's findings) and that bar keeps fewer than
    `guard_keeps(top_k, passages)`, the bar of that many best instead, so the round keeps at
    least what retrieval's top-k would (at most half of a small round)."""
    bar = probability_bar(logits, probability, min_keep)
    reason = f"P(relevant) >= {probability:g}, at least {min_keep} kept"
    if unlike and logits:
        keep = guard_keeps(top_k, len(logits))
        k_bar = sorted(logits, reverse=True)[keep - 1]
        if k_bar < bar:
            return RoundBar(k_bar, "shift_guard",
                            f"unlike the fitting rounds in {'; '.join(unlike)}: at least the "
                            f"top {keep} kept")
        reason += (f" (unlike the fitting rounds in {'; '.join(unlike)}; the bar kept the top "
                   f"{keep} anyway)")
    return RoundBar(bar, "calibrated", reason)


@dataclass(frozen=True)
class Combination:
    """logit = bias + Σ weights[f]·feature f (`FEATURES`); P(relevant) = p_relevant(logit)."""

    weights: Mapping[str, float]
    bias: float = 0.0
    fitted: bool = False
    """Fitted on labelled passages: the probabilities are calibrated."""
    bar: float | None = None
    """The P(relevant) bar that beat retrieval's top-k F1 by the most on the worst source of the
    fitting questions (`training/evaluation/combination_fit.best_bar`; None: unfitted)."""
    min_keep: int = 1
    """Passages the calibrated bar keeps at least (the best), chosen with the bar."""
    top_k: int = 2
    """What retrieval's top-k keeps: the calibrated bar keeps at least the k best of a round
    the shift guard finds unlike the fitting rounds."""
    guard: ShiftGuard | None = None
    """The fitting rounds' statistics (`ShiftGuard`; None: no guard)."""
    embedding_model: str = DEFAULT_EMBEDDING_MODEL
    report: Mapping[str, Any] = field(default_factory=dict)
    """What the fit measured (questions, AUROC with and without the filter, ECE), as stored."""
    filter_format: FilterFormat = "two_stage"
    """How the card's filter reads a passage (`filter_format.card_format`): MCF scores with
    the format the filter was trained in, whatever the combination."""
    window_tokens: int = DEFAULT_WINDOW_TOKENS
    """How many tokens of a document the card's filter reads at once (`windows`: its training
    records' length): a longer document is read window by window."""
    home: HomeRule | None = None
    """The card's home rule (`filters.home`): where a round looks like the filter's home
    text, MCF ranks by its home combination instead of this one (None: no home rule)."""

    def __post_init__(self) -> None:
        unknown = set(self.weights) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown combination features {sorted(unknown)}; known: "
                             f"{', '.join(FEATURES)}")
        if self.bar is not None and not 0.0 < self.bar < 1.0:
            raise ValueError(f"the combination's bar must be a probability in (0, 1), got "
                             f"{self.bar}")
        if self.min_keep < 0 or self.top_k < 1:
            raise ValueError(f"the combination's min_keep must be >= 0 and top_k >= 1, got "
                             f"{self.min_keep} and {self.top_k}")

    def reads_filter(self, score_rule: str = "combined", always_score: bool = False) -> bool:
        """Whether MCF's chunk stage reads the filter: its score is the filter's own or a
        fusion with it (`score_rule` not "combined", `MCFConfig.score_rule`), this combination
        weighs it, or the config asks for its scores anyway (`always_score`,
        `mcf.always_score_chunks`). With the defaults: whether the filter's score moves the
        combined score at all. The one rule MCF, its start line and every description of a
        card ask."""
        return (score_rule != "combined" or always_score
                or any(self.weights.get(f, 0.0) != 0.0 for f in FILTER_FEATURES))

    def logits(self, scores: RoundScores) -> list[float]:
        """The combined logit of each passage of the round."""
        vector = np.array([self.weights.get(f, 0.0) for f in FEATURES])
        return [float(v) + self.bias for v in round_features(scores) @ vector]

    def probabilities(self, scores: RoundScores) -> list[float]:
        """P(relevant) of each passage of the round (calibrated when `fitted`)."""
        return [p_relevant(v) for v in self.logits(scores)]

    def round_bar(self, scores: RoundScores, probability: float | None = None,
                  min_keep: int | None = None, top_k: int | None = None,
                  unlike: Sequence[str] | None = None) -> RoundBar:
        """The calibrated bar of one round at P(relevant) `probability` (default the fitted
        bar), keeping at least `min_keep` and, where the shift guard finds the round unlike
        the fitting rounds, `top_k` (defaults: the fitted ones). `unlike`: the guard's
        findings where the caller has them already (`unlike`; [] to leave the guard off)."""
        return round_bar(self.logits(scores), probability or self.bar or DEFAULT_P_MIN,
                         self.min_keep if min_keep is None else min_keep,
                         self.top_k if top_k is None else top_k,
                         self.unlike(scores) if unlike is None else unlike)

    def unlike(self, scores: RoundScores) -> list[str]:
        """What the shift guard finds unlike the fitting rounds in a round (nothing without a
        guard)."""
        if self.guard is None:
            return []
        logits = self.logits(scores)
        return self.guard.unlike(round_statistics(scores, [p_relevant(v) for v in logits]))

    def calibrated_on(self, scores: RoundScores) -> bool:
        """Whether this combination's P(relevant) is presented as a calibrated probability on
        a round: fitted, and the round like the fitting rounds (the shift guard finds nothing
        `unlike`). On a round unlike them it is a relevance score in [0, 1] that ranks as
        P(relevant) would, not a probability: measured left out, the fitting sources keep
        ECE <= 0.12, but rounds whose base rate moved (web snippets, 3.8 relevant in 10
        against about 2) do not (docs/results/filter.md, "Calibration")."""
        return self.calibrated_given(self.unlike(scores))

    def calibrated_given(self, unlike: Sequence[str]) -> bool:
        """`calibrated_on` from the guard's findings on the round (`unlike`), where the
        caller has them already."""
        return self.fitted and not unlike

    def priors_only_fit(self, where: str = "the card") -> Combination:
        """The fit of BM25 and dense alone stored beside this one (same questions, its own
        bar, calibrated): what MCF decides without the filter. `AdapterError` when the card
        holds none (fitted before it was kept)."""
        section = self.report.get(PRIORS_ONLY_KEY)
        if not self.fitted or not section:
            raise AdapterError(f"{where} holds no priors-only fit: refit its combination with "
                               "`sieverag filter fit-combination`")
        return replace(Combination.from_card({**section, "embedding_model":
                                              self.embedding_model}, where),
                       filter_format=self.filter_format, window_tokens=self.window_tokens)

    @property
    def holds_priors_only_fit(self) -> bool:
        """Whether the fit of BM25 and dense alone is stored beside this one
        (`priors_only_fit`)."""
        return bool(self.report.get(PRIORS_ONLY_KEY))

    def with_priors_only_fit(self, priors: Combination) -> Combination:
        """This combination with `priors`, the fit of BM25 and dense alone on the same
        questions, stored beside it (its rule alone: `rule_section`)."""
        return replace(self, report={**self.report, PRIORS_ONLY_KEY: priors.rule_section()})

    def rule_section(self) -> dict[str, Any]:
        """The combination's rule alone, as a card keeps a fit nested in another section (the
        home rule's, the priors-only fit): `RULE_KEYS` of `as_card`."""
        return {k: v for k, v in self.as_card().items() if k in RULE_KEYS}

    def as_card(self) -> dict[str, Any]:
        """The card's `combination` section."""
        return {"features": list(FEATURES), "weights": {f: self.weights.get(f, 0.0)
                                                        for f in FEATURES},
                "bias": self.bias, "bar": self.bar, "min_keep": self.min_keep,
                "top_k": self.top_k,
                "shift_guard": None if self.guard is None else self.guard.as_card(),
                "calibration": "platt", "embedding_model": self.embedding_model,
                **dict(self.report)}

    @classmethod
    def from_card(cls, section: Mapping[str, Any], where: str) -> Combination:
        """The combination a card's `combination` section holds; `AdapterError` naming
        `where` when it is malformed."""
        try:
            weights = {str(k): float(v) for k, v in dict(section["weights"]).items()}
            bar = section.get("bar")
            report = {k: v for k, v in section.items()
                      if k not in ("features", "weights", "bias", "bar", "calibration",
                                   "embedding_model", "min_keep", "top_k", "shift_guard")}
            guard = section.get("shift_guard")
            return cls(weights=weights, bias=float(section.get("bias", 0.0)), fitted=True,
                       bar=None if bar is None else float(bar),
                       min_keep=int(section.get("min_keep", 1)),
                       top_k=int(section.get("top_k", 2)),
                       guard=None if not guard else ShiftGuard.from_card(guard),
                       embedding_model=str(section.get("embedding_model",
                                                       DEFAULT_EMBEDDING_MODEL)),
                       report=report)
        except (KeyError, TypeError, ValueError) as err:
            raise AdapterError(f"{where}: the card's {COMBINATION_KEY!r} section is malformed "
                               f"({err}); fit it again with `sieverag filter "
                               "fit-combination`") from None


PRIORS_ONLY = Combination(weights={"bm25_z": 1.0, "dense_z": 1.0})
"""No filter card, or retrieval asked for by name: retrieval's z-score fusion of BM25 and
dense, uncalibrated; the filter's score is not used."""

FILTER_ALONE = Combination(weights={"filter_log_odds": 1.0})
"""A trained filter's card without a fitted combination: the filter's own s, so P(relevant)
is its P(Yes) normalised over Yes and No; not fitted on labelled passages."""


def card_combination(card: Mapping[str, Any] | None, where: str = "the card") -> Combination:
    """The fitted combination of an adapter card; a card without one: `FILTER_ALONE`; no
    card (None): `PRIORS_ONLY`. Each carries the card's filter format and window."""
    if card is None:
        return PRIORS_ONLY
    section = card.get(COMBINATION_KEY)
    combination = FILTER_ALONE if not section else Combination.from_card(section, where)
    return replace(combination, filter_format=card_format(card),
                   window_tokens=card_window_tokens(card), home=card_home_rule(card, where))


def card_home_rule(card: Mapping[str, Any], where: str = "the card") -> HomeRule | None:
    """The home rule of a card (`filters.home`; None where it holds none); `AdapterError`
    naming `where` when its section is malformed."""
    section = card.get(HOME_KEY)
    if not section:
        return None
    try:
        combination = Combination.from_card(section["combination"], where)
        report = {k: v for k, v in section.items()
                  if k not in ("sources", "read", "test", "combination")}
        return HomeRule(HomeTest.from_card(section["test"]), combination,
                        int(section.get("read", DEFAULT_HOME_READ)),
                        tuple(str(s) for s in section.get("sources") or ()), report)
    except (AdapterError, KeyError, TypeError, ValueError) as err:
        raise AdapterError(f"{where}: the card's {HOME_KEY!r} section is malformed ({err}); "
                           "fit it again with `sieverag filter fit-combination`") from None


def adapter_combination(folder: str | Path | None) -> Combination:
    """The combination the card of the adapter folder ranks by (`card_combination`: its
    fitted one, else `FILTER_ALONE`); no folder or no card: `PRIORS_ONLY`. A run's filter
    role reads its card with `filter_card.filter_card`, which never falls back silently."""
    if folder is None:
        return PRIORS_ONLY
    return card_combination(read_card(folder), f"{Path(folder)}")


def fitted_questions(card: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    """The (source, question id) pairs the card's combination was fitted on (none where it
    holds no fitted combination): `eval-filter` leaves them out."""
    return frozenset(tuple(q) for q in (card.get(COMBINATION_KEY) or {}).get("questions") or ())


def with_combination(card: Mapping[str, Any], combination: Combination, *,
                     datasets: Sequence[str], questions: Sequence[Sequence[str]]
                     ) -> dict[str, Any]:
    """`card` with `combination` as its `combination` section, with the datasets (their file
    names) and the (source, question id) pairs it was fitted on."""
    section = {**combination.as_card(), "datasets": [Path(d).name for d in datasets],
               "questions": sorted(list(q) for q in questions)}
    return {**card, COMBINATION_KEY: section}


def with_home(card: Mapping[str, Any], home: HomeRule | None) -> dict[str, Any]:
    """`card` with `home` as its `home` section (None: without one)."""
    rest = {k: v for k, v in card.items() if k != HOME_KEY}
    return rest if home is None else {**rest, HOME_KEY: home_section(home)}


def home_section(rule: HomeRule) -> dict[str, Any]:
    """The card's `home` section of a home rule (`card_home_rule` reads it back)."""
    return {"sources": list(rule.sources), "read": rule.read, "test": rule.test.as_card(),
            "combination": rule.combination.rule_section(), **dict(rule.report)}


def fit_combination(rounds: Sequence[RoundScores], labels: Sequence[Sequence[bool]],
                    features: Sequence[str] = FEATURES, *, l2: float = 1.0) -> Combination:
    """The L2-regularised logistic regression (strength 1/`l2` as scikit-learn's C) of the
    passages' labels on the named features, pooled over every round; its weights and bias as
    a fitted `Combination` (no bar, no report: see `training.evaluation.combination_fit`)."""
    from sklearn.linear_model import LogisticRegression

    x, y = _stacked(rounds, labels)
    if y.all() or not y.any():
        raise ValueError("fitting a combination needs relevant and irrelevant passages")
    columns = [FEATURES.index(f) for f in features]
    model = LogisticRegression(C=1.0 / l2, max_iter=1000).fit(x[:, columns], y)
    weights = {f: float(w) for f, w in zip(features, model.coef_[0], strict=True)}
    return Combination(weights=weights, bias=float(model.intercept_[0]), fitted=True)


def _stacked(rounds: Sequence[RoundScores], labels: Sequence[Sequence[bool]]
             ) -> tuple[np.ndarray, np.ndarray]:
    if len(rounds) != len(labels) or any(len(r.bm25) != len(v)
                                         for r, v in zip(rounds, labels, strict=False)):
        raise ValueError("one label per passage of every round")
    x = np.vstack([round_features(r) for r in rounds]) if rounds else np.zeros((0, 0))
    y = np.array([bool(v) for row in labels for v in row])
    return x, y


def probability_bar(logits: Sequence[float], probability: float, min_keep: int) -> float:
    """The bar on a round's combined logits: keep logit ≥ logit(`probability`), and at least
    the `min_keep` best (ties at the bar kept too)."""
    bar = logit_of(probability)
    if min_keep > 0 and logits:
        bar = min(bar, sorted(logits, reverse=True)[min(min_keep, len(logits)) - 1])
    return bar


def passage_priors(question: str, texts: Sequence[str],
                   embedding_model: str = DEFAULT_EMBEDDING_MODEL
                   ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """BM25 of `question` against each of `texts` (IDF over them) and the cosine of the
    question's and each text's embedding (unit vectors from `embedding_model`). Cached per
    round: every MCF rule run on the same round reads them once."""
    return _passage_priors(question, tuple(texts), embedding_model)


@functools.lru_cache(maxsize=1024)
def _passage_priors(question: str, texts: tuple[str, ...], embedding_model: str
                    ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    from sieverag.inference.retrieval.bm25 import question_scores

    bm25 = tuple(question_scores(question, texts))
    vectors = round_vectors(question, texts, embedding_model)
    return bm25, tuple(float(v) for v in vectors[1:] @ vectors[0])
