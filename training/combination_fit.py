"""`sieverag filter fit-combination ADAPTER --dataset FILES`: fit how MCF combines the trained
filter's score with BM25 and dense (`inference/filters/combination.py`), measure what the
filter adds, and write the result into the adapter's card.

The questions: the datasets' gold-marked rows minus the filter's training questions (the
card's list), within a build-dataset folder's validation split when `--split-dir` is given
(the filter's validation split), the first `--limit` of each dataset. Each question is one
round: the filter scores its passages (one batched call), BM25 and dense score them against
the question; `--concurrency N` scores N questions at once, their calls merged on one
in-process `CallBatcher` (the rounds, and so the fit, are the same in dataset order). The
card records the questions used, and `eval-filter` leaves them out, as it leaves out
training questions.

What is measured, by K-fold cross-validation over questions (`measure_combination`):

* AUROC, pooled over every passage, of the combination's out-of-fold P(relevant), of the same
  regression on the priors alone (BM25 and dense features), and of the filter's s, BM25 and
  the dense cosine alone; the filter's gain = combination − priors alone. When the gain is
  below `--min-gain` the filter adds nothing: the card's combination is the priors-alone fit
  (MCF then ranks as retrieval would, calibrated), and `filter list` says so.
* The expected calibration error of the out-of-fold P(relevant) (Platt, the regression's own
  output), beside that of isotonic regression on the same logits, measured, not used.
* The calibrated bar: the P(relevant) bar (keep P ≥ bar and at least the best passage) whose
  F1 on the out-of-fold probabilities beats the better of BM25's and dense's top-k F1 by the
  most on its worst source (`best_bar`): a default that must not lose to retrieval anywhere
  is chosen by where it loses first, not by its mean.

Each figure is also given per source (the dataset's `source`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from sieverag.inference.data import example_source
from sieverag.inference.errors import ConfigError, DatasetError
from sieverag.inference.filters.combination import (
    DEFAULT_EMBEDDING_MODEL,
    FEATURES,
    PRIOR_FEATURES,
    PRIORS_ONLY,
    PRIORS_ONLY_KEY,
    Combination,
    RoundScores,
    fit_combination,
    passage_priors,
    probability_bar,
)
from sieverag.inference.filters.filter_format import FilterFormat
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.inference.metrics.filter import (
    auroc,
    calibration_error,
    decision_quality,
    top_k_indices,
)
from sieverag.inference.types import Example
from sieverag.training.questions_in_flight import by_question

BAR_GRID = tuple(round(0.05 + 0.025 * i, 3) for i in range(37))  # 0.05 … 0.95
TOP_K = MCFConfig().top_k  # the k of the retrieval top-k the bar is measured against


@dataclass(frozen=True)
class LabelledRound:
    """One question's passages: their signals, gold marks, and where the question is from."""

    scores: RoundScores
    labels: tuple[bool, ...]
    source: str = "unknown"
    question_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# ----- what is measured (pure: scores in, combination out) ----------------------------------


def measure_combination(rounds: Sequence[LabelledRound], *, folds: int = 5,
                        min_gain: float = 0.005, seed: int = 0,
                        embedding_model: str = DEFAULT_EMBEDDING_MODEL,
                        by_left_out_source: bool = False) -> Combination:
    """The combination fitted on every round (the priors alone where the filter's
    cross-validated AUROC gain is below `min_gain`), with its calibrated bar and the
    measurements (see the module's docstring) as its `report`. `by_left_out_source` (two
    sources or more): the filter is also left out unless, leaving each source out in turn
    (`leave_one_source_out`), the combination with it loses less to retrieval on its worst
    left-out source than the priors alone do; the table goes into the report."""
    if len(rounds) < 2:
        raise DatasetError(f"fitting a combination needs at least 2 questions, got "
                           f"{len(rounds)}")
    folds = min(folds, len(rounds))
    order = list(range(len(rounds)))
    random.Random(seed).shuffle(order)
    fold_of = {index: position % folds for position, index in enumerate(order)}
    full_oof: list[list[float]] = [[] for _ in rounds]
    priors_oof: list[list[float]] = [[] for _ in rounds]
    isotonic_oof: list[list[float]] = [[] for _ in rounds]
    for fold in range(folds):
        train = [r for i, r in enumerate(rounds) if fold_of[i] != fold]
        full, priors = _fit(train, FEATURES), _fit(train, PRIOR_FEATURES)
        isotonic = _isotonic(full, train)
        for i, held in enumerate(rounds):
            if fold_of[i] == fold:
                full_oof[i] = full.probabilities(held.scores)
                priors_oof[i] = priors.probabilities(held.scores)
                isotonic_oof[i] = list(isotonic.predict(full.logits(held.scores)))
    uses_filter = (_auroc(rounds, full_oof) or 0.0) - (_auroc(rounds, priors_oof) or 0.0) \
        >= min_gain
    left_out = leave_one_source_out(rounds) if by_left_out_source else None
    if left_out is not None:
        uses_filter = uses_filter and (worst_left_out_margin(left_out, "with_filter")
                                       > worst_left_out_margin(left_out, "priors_alone"))
    chosen = full_oof if uses_filter else priors_oof
    bar, bar_f1, bar_margin = best_bar(rounds, chosen)
    final = _fit(rounds, FEATURES if uses_filter else PRIOR_FEATURES)
    priors_bar = best_bar(rounds, priors_oof)[0]
    priors_fit = _fit(rounds, PRIOR_FEATURES)
    report = {"fit": {**_figures(rounds, full_oof, priors_oof, chosen, isotonic_oof),
                      "questions": len(rounds), "passages": sum(len(r.labels) for r in rounds),
                      "folds": folds, "min_gain": min_gain, "filter_adds_nothing": not uses_filter,
                      "bar_f1": bar_f1, "bar_worst_source_margin": bar_margin,
                      "by_source": {source: _figures(*_of_source(source, rounds, full_oof,
                                                                 priors_oof, chosen,
                                                                 isotonic_oof))
                                    for source in sorted({r.source for r in rounds})}}}
    if left_out is not None:
        report["fit"]["leave_one_source_out"] = left_out
    # The priors-only fit is kept whatever was chosen, so MCF can run it by name
    # (`--mcf.combination priors_only`): what the filter adds is one flag away.
    report[PRIORS_ONLY_KEY] = {"weights": dict(priors_fit.weights), "bias": priors_fit.bias,
                               "bar": priors_bar}
    return replace(final, bar=bar, embedding_model=embedding_model, report=report)


def _fit(rounds: Sequence[LabelledRound], features: Sequence[str]) -> Combination:
    try:
        return fit_combination([r.scores for r in rounds], [r.labels for r in rounds], features)
    except ValueError as err:
        raise DatasetError(f"cannot fit the combination on {len(rounds)} questions: {err}; "
                           "give more questions (--limit, more datasets)") from None


def _isotonic(combination: Combination, rounds: Sequence[LabelledRound]) -> Any:
    from sklearn.isotonic import IsotonicRegression

    logits = [v for r in rounds for v in combination.logits(r.scores)]
    labels = [v for r in rounds for v in r.labels]
    return IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(logits, labels)


def _of_source(source: str, *columns: Sequence[Any]) -> list[list[Any]]:
    rounds = columns[0]
    keep = [i for i, r in enumerate(rounds) if r.source == source]
    return [[column[i] for i in keep] for column in columns]


def _labels(rounds: Sequence[LabelledRound]) -> list[bool]:
    return [v for r in rounds for v in r.labels]


def _auroc(rounds: Sequence[LabelledRound], values: Sequence[Sequence[float]]) -> float | None:
    return auroc(_labels(rounds), [v for row in values for v in row])


def _figures(rounds: Sequence[LabelledRound], full: Sequence[Sequence[float]],
             priors: Sequence[Sequence[float]], chosen: Sequence[Sequence[float]],
             isotonic: Sequence[Sequence[float]]) -> dict[str, Any]:
    """AUROC of each score and the calibration error of the out-of-fold probabilities."""
    labels = _labels(rounds)
    with_filter, alone = _auroc(rounds, full), _auroc(rounds, priors)
    return {
        "auroc": {"combination": _auroc(rounds, chosen), "with_filter": with_filter,
                  "priors_alone": alone,
                  "filter_alone": _auroc(rounds, [r.scores.filter_log_odds for r in rounds]),
                  "bm25": _auroc(rounds, [r.scores.bm25 for r in rounds]),
                  "dense": _auroc(rounds, [r.scores.dense for r in rounds])},
        "filter_gain_auroc": (None if with_filter is None or alone is None
                              else with_filter - alone),
        "ece": {"platt": calibration_error(labels, [v for row in chosen for v in row]),
                "isotonic": calibration_error(labels, [v for row in isotonic for v in row])},
    }


def best_bar(rounds: Sequence[LabelledRound], probabilities: Sequence[Sequence[float]],
             top_k: int = TOP_K) -> tuple[float, float, float]:
    """The P(relevant) bar of `BAR_GRID` whose rule (keep P ≥ bar, at least the best passage)
    beats retrieval by the most where it beats it the least: per source, the rule's mean
    per-question F1 minus the better of BM25's and dense's top-k F1 on that source's rounds;
    the bar with the largest smallest margin wins (ties: the best F1 over every round, then the
    highest bar). With one source this is the bar with the best F1.

    Returns the bar, its F1 over every round and its worst source's margin."""
    sources = sorted({r.source for r in rounds})
    by_source = {s: [i for i, r in enumerate(rounds) if r.source == s] for s in sources}
    gold = [{i for i, g in enumerate(r.labels) if g} for r in rounds]

    def f1(kept: Sequence[set[int]], among: Sequence[int]) -> float:
        return decision_quality([(kept[i], gold[i]) for i in among])["f1"] or 0.0

    retrieval = {s: retrieval_f1([rounds[i] for i in by_source[s]], top_k) for s in sources}
    best: tuple[tuple[float, float, float], float, float, float] | None = None
    for bar in BAR_GRID:
        kept = kept_at_bar(probabilities, bar)
        margin = min(f1(kept, by_source[s]) - retrieval[s] for s in sources)
        overall = f1(kept, range(len(rounds)))
        key = (round(margin, 9), round(overall, 9), bar)  # rounded: float noise is a tie
        if best is None or key >= best[0]:
            best = (key, bar, overall, margin)
    return best[1:]


def kept_at_bar(probabilities: Sequence[Sequence[float]], bar: float) -> list[set[int]]:
    """Per round, the passages MCF's calibrated bar keeps: P(relevant) ≥ bar, and at least
    the best one (`probability_bar` with min_keep 1)."""
    kept = []
    for row in probabilities:
        logits = [_logit(p) for p in row]
        threshold = probability_bar(logits, bar, 1)
        kept.append({i for i, v in enumerate(logits) if v >= threshold})
    return kept


def rounds_f1(rounds: Sequence[LabelledRound], kept: Sequence[set[int]]) -> float:
    """Mean per-question F1 of what was kept against the rounds' gold."""
    return decision_quality([(k, {i for i, g in enumerate(r.labels) if g})
                             for k, r in zip(kept, rounds, strict=True)])["f1"] or 0.0


def retrieval_f1(rounds: Sequence[LabelledRound], top_k: int = TOP_K) -> float:
    """The better of BM25's and dense's top-k F1 on the rounds."""
    return max(rounds_f1(rounds, [set(top_k_indices(values(r), top_k)) for r in rounds])
               for values in (lambda r: r.scores.bm25, lambda r: r.scores.dense))


def leave_one_source_out(rounds: Sequence[LabelledRound], top_k: int = TOP_K
                         ) -> dict[str, dict[str, Any]]:
    """For each source in turn: the combination with the filter, and the priors alone, each
    fitted with its bar (`best_bar`) on every other source's rounds, then measured on the
    source left out: AUROC, ECE, the bar, the F1 it keeps there, and its margin over the
    better of BM25's and dense's top-k F1 there. What a source the fit never saw gets."""
    sources = sorted({r.source for r in rounds})
    if len(sources) < 2:
        raise DatasetError(f"leaving one source out needs at least 2 sources, got "
                           f"{sources}")
    table: dict[str, dict[str, Any]] = {}
    for left in sources:
        train = [r for r in rounds if r.source != left]
        held = [r for r in rounds if r.source == left]
        retrieval = retrieval_f1(held, top_k)
        row: dict[str, Any] = {"questions": len(held), "retrieval_top_k_f1": retrieval}
        for name, features in (("with_filter", FEATURES), ("priors_alone", PRIOR_FEATURES)):
            fitted = _fit(train, features)
            bar = best_bar(train, [fitted.probabilities(r.scores) for r in train], top_k)[0]
            probabilities = [fitted.probabilities(r.scores) for r in held]
            f1 = rounds_f1(held, kept_at_bar(probabilities, bar))
            row[name] = {"auroc": _auroc(held, probabilities),
                         "ece": calibration_error(_labels(held),
                                                  [p for ps in probabilities for p in ps]),
                         "bar": bar, "f1": f1, "margin": f1 - retrieval}
        table[left] = row
    return table


def worst_left_out_margin(table: dict[str, dict[str, Any]], rule: str) -> float:
    """The smallest margin over retrieval of `rule` (with_filter, priors_alone) among the
    sources left out in turn."""
    return min(row[rule]["margin"] for row in table.values())


def _logit(probability: float) -> float:
    p = min(max(probability, 1e-12), 1 - 1e-12)
    return float(np.log(p / (1 - p)))


# ----- the command: questions, the filter's scores, the card ---------------------------------


def fitting_questions(datasets: Sequence[str], card: dict[str, Any], *, adapter: str,
                      split_dir: str | None = None, limit: int | None = None
                      ) -> dict[str, list[Example]]:
    """Dataset → its questions to fit on (gold-marked, not training questions of the card of
    `adapter`, within `split_dir`'s validation questions when given, the first `limit`)."""
    from sieverag.inference.data import load_examples

    trained = {tuple(q) for q in (card.get("dataset") or {}).get("train_questions") or ()}
    validation = None
    if split_dir is not None:
        from sieverag.training.data import question_ids

        validation = question_ids(split_dir, "validation")
        if not validation:
            raise DatasetError(f"{split_dir} has no validation questions: build it "
                               "with --validation-fraction > 0, or leave out --split-dir")
    elif not trained:
        raise ConfigError(f"the card of {adapter} lists no training questions: pass "
                          "--split-dir (its build-dataset folder) so only validation "
                          "questions are fitted on")
    chosen = {}
    for dataset in datasets:
        eligible = [e for e in load_examples(dataset)
                    if any(d.is_gold for d in e.documents)
                    and not all(d.is_gold for d in e.documents)
                    and (example_source(e), e.id) not in trained
                    and (validation is None or (example_source(e), e.id) in validation)]
        if not eligible:
            raise DatasetError(f"{dataset}: no question to fit on (each needs gold and "
                               "non-gold passages, outside the filter's training questions"
                               + (f", inside {split_dir}'s validation split"
                                  if validation is not None else "") + ")")
        chosen[dataset] = eligible[:limit]
    return chosen


def score_rounds(backend: Any, examples: Sequence[Example], embedding_model: str, *,
                 filter_format: FilterFormat = "two_stage", progress: bool = True,
                 concurrency: int = 1) -> list[LabelledRound]:
    """Each question's passages scored by the filter (MCF's chunk scores, read in the
    filter's format), BM25 and dense; `concurrency` questions at once, the rounds in dataset
    order."""
    from sieverag.inference.filters.mcf import MultiGranularFilter

    mcf = MultiGranularFilter(backend, combination=replace(PRIORS_ONLY,
                                                           filter_format=filter_format))

    def one_round(example: Example) -> LabelledRound:
        scores = mcf.chunk_scores(example.question, example.documents)
        bm25, dense = passage_priors(example.question,
                                     [d.as_context() for d in example.documents],
                                     embedding_model)
        return LabelledRound(
            RoundScores(tuple(s["score"] for s in scores), tuple(bm25), tuple(dense)),
            tuple(bool(d.is_gold) for d in example.documents), example_source(example),
            example.id)

    return list(by_question(examples, one_round, concurrency=concurrency,
                            desc="scoring passages", progress=progress,
                            resumable=False).values())
