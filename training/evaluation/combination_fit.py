"""`sieverag filter fit-combination ADAPTER --dataset FILES`: fit how MCF combines the trained
filter's score with BM25 and dense (`inference/filters/card/combination.py`), measure what the
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

`--by-left-out-source` (two sources or more) chooses **every** default on sources the fit did
not see (`rule_search`): each candidate rule (`CANDIDATES`: the combination with the filter or
the priors alone, `min_keep`, and the shift guard's level and `top_k`) is fitted on all
sources but one (its weights, its bar by `best_bar`, its guard's ranges) and measured on the
one left out (`measured_on`: F1 at its bar, the margin over the better of BM25's and dense's
top-2 F1 there, ECE, passages kept, rounds the guard decided); the default is the rule whose
worst left-out source is best (`best_rule`), among the filter's rules only when its
cross-validated gain meets `--min-gain`. It is then fitted on every source and written with
the table of every candidate and the left-out rows of the default, of the best rule with the
filter and of the best with the priors alone. A user's text is always a source no fit saw.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.types import Example
from sieverag.inference.data import example_source
from sieverag.inference.filters.card.combination import (
    DEFAULT_EMBEDDING_MODEL,
    FEATURES,
    PRIOR_FEATURES,
    PRIORS_ONLY,
    Combination,
    RoundScores,
    ShiftGuard,
    fit_combination,
    passage_priors,
    round_bar,
    round_statistics,
)
from sieverag.inference.filters.filter_format import FilterFormat, p_relevant
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.inference.metrics.filter_scores import (
    auroc,
    calibration_error,
    decision_quality,
    top_k_indices,
)
from sieverag.training.evaluation.questions_in_flight import by_question

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
                        by_left_out_source: bool = False,
                        candidates: Sequence[SelectionRule] | None = None) -> Combination:
    """The combination fitted on every round (the priors alone where the filter's
    cross-validated AUROC gain is below `min_gain`), with its calibrated bar and the
    measurements (see the module's docstring) as its `report`. `by_left_out_source` (two
    sources or more): the rule (features, bar, min_keep, guard, top_k) is the one of
    `candidates` (default `CANDIDATES`) whose worst left-out source is best, the filter's
    rules only where its gain meets `min_gain`; the tables go into the report. Without it: the
    features by the gain alone, min_keep 1, no guard."""
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
    gain_met = (_auroc(rounds, full_oof) or 0.0) - (_auroc(rounds, priors_oof) or 0.0) \
        >= min_gain
    if by_left_out_source:
        # Every default (features, weights, bar, min_keep, top_k, guard) is the candidate
        # whose worst left-out source is best; the filter's rules compete only when its
        # cross-validated gain meets min_gain.
        search = rule_search(rounds, CANDIDATES if candidates is None else candidates)
        allowed = {r: rows for r, rows in search.items()
                   if gain_met or r.features == "priors_alone"}
        priors_rule = (best_rule(search, "priors_alone")
                       if any(r.features == "priors_alone" for r in search)
                       else SelectionRule("priors_alone", 1, TOP_K, None))
        rule = best_rule(allowed) if allowed else priors_rule
        keeps_filter = rule.features == "with_filter"
    else:
        keeps_filter = gain_met
        rule = SelectionRule("with_filter" if keeps_filter else "priors_alone", 1, TOP_K, None)
        priors_rule = SelectionRule("priors_alone", 1, TOP_K, None)
    chosen = full_oof if keeps_filter else priors_oof
    final, priors_fit = fit_rule(rule, rounds), fit_rule(priors_rule, rounds)
    report = {"fit": {**_figures(rounds, full_oof, priors_oof, chosen, isotonic_oof),
                      "questions": len(rounds), "passages": sum(len(r.labels) for r in rounds),
                      "folds": folds, "min_gain": min_gain, "filter_adds_nothing": not keeps_filter,
                      "filter_gain_meets_min_gain": gain_met, "rule": rule.as_card(),
                      **final.report,  # the chosen bar's F1 and worst source margin
                      "by_source": {source: _figures(*_of_source(source, rounds, full_oof,
                                                                 priors_oof, chosen,
                                                                 isotonic_oof))
                                    for source in sorted({r.source for r in rounds})}}}
    if by_left_out_source:
        report["fit"]["leave_one_source_out"] = left_out_table(rounds, search, {
            "default": rule, **{name: best_rule(search, name)
                                for name in ("with_filter", "priors_alone")
                                if any(r.features == name for r in search)}})
        report["fit"]["candidates"] = [
            {**r.as_card(), "rule": r.name, "worst_margin": worst_margin(rows)[0],
             "mean_f1": worst_margin(rows)[1], "allowed": r in allowed, "chosen": r == rule}
            for r, rows in sorted(search.items(), key=lambda item: worst_margin(item[1]),
                                  reverse=True)]
    # The priors-only fit is kept whatever was chosen, so MCF can run it by name
    # (`--mcf.combination priors_only`): what the filter adds is one flag away.
    return replace(final, embedding_model=embedding_model,
                   report=report).with_priors_only_fit(priors_fit)


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
             top_k: int = TOP_K, *, min_keep: int = 1, keep_top: int = TOP_K,
             unlike: Sequence[Sequence[str]] | None = None) -> tuple[float, float, float]:
    """The P(relevant) bar of `BAR_GRID` whose rule (`kept_at_bar`: keep P ≥ bar, at least
    `min_keep`, and at least `keep_top` in a round the shift guard found `unlike` the fitting
    rounds) beats retrieval by the most where it beats it the least: per source, the rule's
    mean per-question F1 minus the better of BM25's and dense's top-`top_k` F1 on that
    source's rounds; the bar with the largest smallest margin wins (ties: the best F1 over
    every round, then the highest bar). With one source this is the bar with the best F1.

    Returns the bar, its F1 over every round and its worst source's margin."""
    sources = sorted({r.source for r in rounds})
    by_source = {s: [i for i, r in enumerate(rounds) if r.source == s] for s in sources}
    gold = [{i for i, g in enumerate(r.labels) if g} for r in rounds]

    def f1(kept: Sequence[set[int]], among: Sequence[int]) -> float:
        return decision_quality([(kept[i], gold[i]) for i in among])["f1"] or 0.0

    retrieval = {s: retrieval_f1([rounds[i] for i in by_source[s]], top_k) for s in sources}
    logits = [[_logit(p) for p in row] for row in probabilities]
    best: tuple[tuple[float, float, float], float, float, float] | None = None
    for bar in BAR_GRID:
        kept = _kept(logits, bar, min_keep, keep_top, unlike)
        margin = min(f1(kept, by_source[s]) - retrieval[s] for s in sources)
        overall = f1(kept, range(len(rounds)))
        key = (round(margin, 9), round(overall, 9), bar)  # rounded: float noise is a tie
        if best is None or key >= best[0]:
            best = (key, bar, overall, margin)
    return best[1:]


def kept_at_bar(probabilities: Sequence[Sequence[float]], bar: float, *, min_keep: int = 1,
                keep_top: int = TOP_K, unlike: Sequence[Sequence[str]] | None = None
                ) -> list[set[int]]:
    """Per round, the passages MCF's calibrated bar keeps (`combination.round_bar`, the rule
    MCF runs): P(relevant) ≥ bar, at least the `min_keep` best, and at least the `keep_top`
    best where the round's entry of `unlike` (the shift guard's findings) is not empty."""
    return _kept([[_logit(p) for p in row] for row in probabilities], bar, min_keep, keep_top,
                 unlike)


def _kept(logits: Sequence[Sequence[float]], bar: float, min_keep: int, keep_top: int,
          unlike: Sequence[Sequence[str]] | None) -> list[set[int]]:
    kept = []
    for i, row in enumerate(logits):
        decided = round_bar(row, bar, min_keep, keep_top, unlike[i] if unlike else ())
        kept.append({j for j, v in enumerate(row) if v >= decided.bar})
    return kept


def rounds_f1(rounds: Sequence[LabelledRound], kept: Sequence[set[int]]) -> float:
    """Mean per-question F1 of what was kept against the rounds' gold."""
    return decision_quality([(k, {i for i, g in enumerate(r.labels) if g})
                             for k, r in zip(kept, rounds, strict=True)])["f1"] or 0.0


def retrieval_f1(rounds: Sequence[LabelledRound], top_k: int = TOP_K) -> float:
    """The better of BM25's and dense's top-k F1 on the rounds."""
    return max(rounds_f1(rounds, [set(top_k_indices(values(r), top_k)) for r in rounds])
               for values in (lambda r: r.scores.bm25, lambda r: r.scores.dense))


# ----- the default, chosen leave-one-source-out ----------------------------------------------


@dataclass(frozen=True)
class SelectionRule:
    """One candidate default: which features the combination reads, how many passages its
    bar keeps at least, the k of retrieval's top-k the shift guard keeps at least, and the
    guard's level (None: no guard). Its weights, bar and guard ranges are fitted
    (`fit_rule`)."""

    features: str  # "with_filter" or "priors_alone"
    min_keep: int
    top_k: int
    guard_level: float | None

    @property
    def name(self) -> str:
        guard = "no guard" if self.guard_level is None else f"guard {self.guard_level:g}"
        return f"{self.features}, min_keep {self.min_keep}, top_k {self.top_k}, {guard}"

    def as_card(self) -> dict[str, Any]:
        return {"features": self.features, "min_keep": self.min_keep, "top_k": self.top_k,
                "guard_level": self.guard_level}


GUARD_LEVELS = (None, 0.01, 0.05, 0.10)
CANDIDATES = tuple(SelectionRule(features, min_keep, top_k, level)
                   for features in ("with_filter", "priors_alone")
                   for min_keep in (1, 2) for top_k in (1, 2, 3) for level in GUARD_LEVELS
                   if (level is None and top_k == TOP_K) or (level is not None
                                                             and top_k > min_keep))
"""The rules `measure_combination` chooses among, leave-one-source-out (top_k only matters to a
guard; a guard that keeps no more than min_keep is no guard, and left out)."""


def fit_rule(rule: SelectionRule, rounds: Sequence[LabelledRound],
             top_k: int = TOP_K) -> Combination:
    """`rule` fitted on `rounds`: the regression on its features, its shift guard's ranges
    over the rounds, and its bar (`best_bar`, against retrieval's top-`top_k`; the bar's F1
    and worst source margin are its `report`)."""
    fitted = _fit(rounds, FEATURES if rule.features == "with_filter" else PRIOR_FEATURES)
    probabilities = [fitted.probabilities(r.scores) for r in rounds]
    guard = None
    unlike: list[list[str]] | None = None
    if rule.guard_level is not None:
        guard = ShiftGuard.fit([round_statistics(r.scores, p)
                                for r, p in zip(rounds, probabilities, strict=True)],
                               rule.guard_level)
        unlike = [guard.unlike(round_statistics(r.scores, p))
                  for r, p in zip(rounds, probabilities, strict=True)]
    bar, f1, margin = best_bar(rounds, probabilities, top_k, min_keep=rule.min_keep,
                               keep_top=rule.top_k, unlike=unlike)
    return replace(fitted, bar=bar, min_keep=rule.min_keep, top_k=rule.top_k, guard=guard,
                   report={"bar_f1": f1, "bar_worst_source_margin": margin})


def measured_on(combination: Combination, rounds: Sequence[LabelledRound],
                top_k: int = TOP_K) -> dict[str, Any]:
    """What `combination` (fitted elsewhere) keeps on `rounds` under MCF's calibrated bar:
    F1, its margin over the better of BM25's and dense's top-k F1, AUROC, ECE over every
    round and over the rounds MCF calls calibrated (`Combination.calibrated_on`) with their
    share, passages kept a question and the share of rounds the shift guard decided."""
    probabilities, kept, guarded, calibrated = [], [], 0, []
    for r in rounds:
        logits = combination.logits(r.scores)
        unlike = combination.unlike(r.scores)
        decided = combination.round_bar(r.scores, unlike=unlike)
        guarded += decided.rule == "shift_guard"
        probabilities.append([p_relevant(v) for v in logits])
        kept.append({i for i, v in enumerate(logits) if v >= decided.bar})
        calibrated.append(combination.calibrated_given(unlike))
    f1 = rounds_f1(rounds, kept)
    called = [i for i, c in enumerate(calibrated) if c]
    return {"auroc": _auroc(rounds, probabilities),
            "ece": calibration_error(_labels(rounds), [p for ps in probabilities for p in ps]),
            "ece_calibrated": calibration_error(
                [v for i in called for v in rounds[i].labels],
                [p for i in called for p in probabilities[i]]),
            "calibrated": len(called) / max(len(rounds), 1),
            "bar": combination.bar, "f1": f1, "margin": f1 - retrieval_f1(rounds, top_k),
            "kept_per_question": sum(map(len, kept)) / max(len(rounds), 1),
            "guarded": guarded / max(len(rounds), 1)}


def rule_search(rounds: Sequence[LabelledRound], candidates: Sequence[SelectionRule] = CANDIDATES,
                top_k: int = TOP_K) -> dict[SelectionRule, dict[str, dict[str, Any]]]:
    """Each candidate rule fitted on all sources but one and measured on the one left out
    (`measured_on`), for each source in turn: rule → source → its row."""
    sources = sorted({r.source for r in rounds})
    if len(sources) < 2:
        raise DatasetError(f"leaving one source out needs at least 2 sources, got "
                           f"{sources}")
    split = {s: ([r for r in rounds if r.source != s], [r for r in rounds if r.source == s])
             for s in sources}
    return {rule: {s: measured_on(fit_rule(rule, train, top_k), held, top_k)
                   for s, (train, held) in split.items()}
            for rule in candidates}


TIE_MARGIN = 0.01
"""Worst left-out margins within one point of F1 of the best are a tie (broken by the mean
left-out F1): a source of 60 questions cannot tell such rules apart (a paired per-question F1
difference has a standard error of about 0.04 there)."""


def worst_margin(rows: dict[str, dict[str, Any]]) -> tuple[float, float]:
    """A rule's worst left-out margin over retrieval, then its mean left-out F1: the key
    `best_rule` ranks by."""
    return (round(min(r["margin"] for r in rows.values()), 9),
            round(sum(r["f1"] for r in rows.values()) / len(rows), 9))


def best_rule(search: dict[SelectionRule, dict[str, dict[str, Any]]],
              features: str | None = None) -> SelectionRule:
    """The rule of `search` (of `features` only, when given) whose worst left-out source is
    best: among those within `TIE_MARGIN` of the best worst margin, the one with the best
    mean left-out F1."""
    among = [r for r in search if features is None or r.features == features]
    best = max(worst_margin(search[r])[0] for r in among)
    tied = [r for r in among if worst_margin(search[r])[0] >= best - TIE_MARGIN]
    return max(tied, key=lambda rule: worst_margin(search[rule])[::-1])


def leave_one_source_out(rounds: Sequence[LabelledRound], top_k: int = TOP_K,
                         candidates: Sequence[SelectionRule] = CANDIDATES
                         ) -> dict[str, dict[str, Any]]:
    """For each source in turn: the best rule with the filter and the best with the priors
    alone (`best_rule` over `rule_search`), each fitted on every other source's rounds and
    measured on the source left out. What a source the fit never saw gets."""
    search = rule_search(rounds, candidates, top_k)
    return left_out_table(rounds, search, {
        name: best_rule(search, name) for name in ("with_filter", "priors_alone")
        if any(r.features == name for r in search)}, top_k)


def left_out_table(rounds: Sequence[LabelledRound],
                   search: dict[SelectionRule, dict[str, dict[str, Any]]],
                   rules: dict[str, SelectionRule], top_k: int = TOP_K
                   ) -> dict[str, dict[str, Any]]:
    """Source → its questions, retrieval's top-k F1 there, and each named rule's left-out row
    (`measured_on`, with the rule's name)."""
    table: dict[str, dict[str, Any]] = {}
    for source in sorted({r.source for r in rounds}):
        held = [r for r in rounds if r.source == source]
        table[source] = {"questions": len(held),
                         "retrieval_top_k_f1": retrieval_f1(held, top_k),
                         **{name: {**search[rule][source], "rule": rule.name}
                            for name, rule in rules.items()}}
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
        from sieverag.training.sft.data import question_ids

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
                 concurrency: int = 1, scores_file: str | Path | None = None,
                 fingerprint: str = "") -> list[LabelledRound]:
    """Each question's passages scored by the filter (MCF's chunk scores, read in the
    filter's format), BM25 and dense; `concurrency` questions at once, the rounds in dataset
    order. `scores_file`: a JSONL of scored rounds kept across runs; a round whose question,
    passages, gold marks, filter `fingerprint` and embedding model match a line is read from it
    instead of scored again, and every round scored is appended to it as it finishes."""
    from sieverag.inference.filters.mcf import MultiGranularFilter

    mcf = MultiGranularFilter(backend, combination=replace(PRIORS_ONLY,
                                                           filter_format=filter_format))
    kept = RoundsFile(scores_file, f"{fingerprint}|{filter_format}|{embedding_model}")

    def one_round(example: Example) -> LabelledRound:
        found = kept.get(example)
        if found is not None:
            return found
        scores = mcf.chunk_scores(example.question, example.documents)
        bm25, dense = passage_priors(example.question,
                                     [d.as_context() for d in example.documents],
                                     embedding_model)
        scored = LabelledRound(
            RoundScores(tuple(s["score"] for s in scores), tuple(bm25), tuple(dense)),
            tuple(bool(d.is_gold) for d in example.documents), example_source(example),
            example.id)
        kept.add(example, scored)
        return scored

    return list(by_question(examples, one_round, concurrency=concurrency,
                            desc="scoring passages", progress=progress,
                            resumable=False).values())


class RoundsFile:
    """Scored rounds kept in a JSONL file (`score_rounds`'s `scores_file`), one line a round,
    keyed by what its scores depend on; None: nothing kept."""

    def __init__(self, path: str | Path | None, identity: str) -> None:
        self.path = None if path is None else Path(path)
        self.identity = identity
        self.lines: dict[str, LabelledRound] = {}
        self.lock = threading.Lock()
        if self.path is not None and self.path.is_file():
            for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1):
                try:
                    row = json.loads(line)
                    self.lines[row["key"]] = LabelledRound(
                        RoundScores(*(tuple(row[k]) for k in ("filter", "bm25", "dense"))),
                        tuple(row["labels"]), row["source"], row["question_id"])
                except (ValueError, KeyError, TypeError) as err:
                    raise DatasetError(f"{self.path}, line {number}: not a scored round "
                                       f"({err}); delete the file to score again") from None

    def key(self, example: Example) -> str:
        payload = json.dumps([self.identity, example_source(example), example.id,
                              example.question, [d.as_context() for d in example.documents],
                              [bool(d.is_gold) for d in example.documents]])
        return hashlib.sha256(payload.encode()).hexdigest()

    def get(self, example: Example) -> LabelledRound | None:
        return self.lines.get(self.key(example)) if self.path is not None else None

    def add(self, example: Example, scored: LabelledRound) -> None:
        if self.path is None:
            return
        row = {"key": self.key(example), "source": scored.source,
               "question_id": scored.question_id, "filter": list(scored.scores.filter_log_odds),
               "bm25": list(scored.scores.bm25), "dense": list(scored.scores.dense),
               "labels": list(scored.labels)}
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
