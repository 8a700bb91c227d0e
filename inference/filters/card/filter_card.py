"""The card a filter role's scores are read by, and the questions asked of a card.

* `FilterCard` — a card (or none), where it was read, and its folder (`role_card.filter_card`
  finds the card of a run's filter role: in-process, its adapter's; served, named, shown by
  the server on `/models`, or the installed filter of the served name);
* which combination ranks (`FilterCard.combination`, `combination.card_combination`), whether
  the filter is read for a round's chunks (`Combination.reads_filter`, the one rule), and the
  lines that say so: `ranking_statement` (what every command that ranks by a filter prints at
  start), `describe_combination` and `describe_home` (`filter list`, `filter
  fit-combination`, the end of `train`), `filter_role` (the demo's closing line) and
  `held_out_f1` (`filter list`).

Whether a round is the filter's home is its home rule's question (`filters.home`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sieverag.inference.filters.card.card_file import CARD_FILE
from sieverag.inference.filters.card.combination import (
    COMBINATION_KEY,
    FILTER_ALONE_FIT,
    PRIORS_ONLY,
    Combination,
    card_combination,
)
from sieverag.inference.filters.home import HomeRule


class RankingSettings(Protocol):
    """What a ranking statement reads of MCF's settings (`mcf.MCFConfig` has them): the card
    asks nothing else of MCF, and the card package stays below it."""

    combination: str
    lexical_weight: float | None
    always_score_chunks: bool
    home: str

    @property
    def score_rule(self) -> str: ...

# The `models.filter_card` that ranks a served filter's documents by BM25 + dense alone.
RETRIEVAL_ONLY = "retrieval-only"
# The source of the card a run reads when retrieval is asked for by name (none).
RETRIEVAL_ONLY_SOURCE = f"models.filter_card={RETRIEVAL_ONLY}"


@dataclass(frozen=True)
class FilterCard:
    """The card a filter role's scores are read by (`role_card.filter_card`): the card
    (None: ranking by retrieval alone, asked for by name), where it was read, and the adapter
    folder that holds it where it is local."""

    card: Mapping[str, Any] | None
    source: str
    folder: str | None = None

    @property
    def combination(self) -> Combination:
        """The combination the card ranks by (`card_combination`: its fitted one, else
        `FILTER_ALONE`); no card (retrieval asked for by name, or none): `PRIORS_ONLY`."""
        if self.card is None:
            return PRIORS_ONLY
        return card_combination(self.card, self.source)

    def ranking_statement(self, mcf: RankingSettings) -> str:
        """Which score MCF ranks by with this card under `mcf`, and why: the line `eval`,
        `ask` and `demo` print at start (`combination.ranking_statement`)."""
        if self.card is not None:
            where = self.source
        elif self.source == RETRIEVAL_ONLY_SOURCE:
            where = f"{RETRIEVAL_ONLY_SOURCE} asks for it"
        else:
            where = (f"the filter adapter {self.folder} has no {CARD_FILE}" if self.folder
                     else "the in-process filter has no adapter")
        return ranking_statement(self.combination, where,
                                 priors_only=mcf.combination == "priors_only",
                                 score_rule=mcf.score_rule, lexical_weight=mcf.lexical_weight,
                                 always_score=mcf.always_score_chunks, home=mcf.home)


def held_out_f1(card: Mapping[str, Any] | None) -> str:
    """Held-out chunk F1 of MCF's default: its worst source left out of the fit where the
    card's combination was chosen leave-one-source-out, else the card's eval-filter figure of
    the rule amber runs by default ("–" when the card has neither; `filter list` shows it)."""
    fit = ((card or {}).get(COMBINATION_KEY) or {}).get("fit") or {}
    left_out = [row["default"]["f1"] for row in (fit.get("leave_one_source_out") or {}).values()
                if "default" in row]
    if left_out:
        return f"{min(left_out):.3f} worst"
    held_out = (card or {}).get("held_out") or {}
    figures = (held_out.get("chunk") or {}).get(held_out.get("amber_default_row") or "")
    return "–" if not figures or figures.get("f1") is None else f"{figures['f1']:.3f}"


def describe_combination(combination: Combination) -> str:
    """What a combination is and what its fit measured, in a few lines (`filter list`,
    `filter fit-combination`, the end of `train`)."""
    if not combination.fitted:
        ranks = ("the filter's own score, P(Yes) normalised over Yes and No"
                 if combination.reads_filter() else "retrieval alone, z(BM25) + z(dense)")
        return (f"not fitted: MCF ranks by {ranks}, uncalibrated, and its calibrated bar keeps "
                "the top_k; fit the combination with `sieverag filter fit-combination`")
    fit = combination.report.get("fit") or {}
    weights = ", ".join(f"{f} {w:+.3f}" for f, w in combination.weights.items() if w)
    lines = [f"logit = {combination.bias:+.3f} + {weights}"
             + (f"; calibrated bar P(relevant) >= {combination.bar:g}, at least "
                f"{combination.min_keep} kept" if combination.bar is not None else "")]
    if combination.guard is not None:
        lines.append(f"shift guard: a round whose {', '.join(combination.guard.ranges)} fall "
                     f"outside the central {1 - 2 * combination.guard.level:.0%} of the fitting "
                     f"rounds' keeps at least the top {combination.top_k}")
    if fit.get(FILTER_ALONE_FIT):
        lines.append(f"Platt scaling of the filter's score alone, on {fit.get('questions')} "
                     f"question(s): {fit[FILTER_ALONE_FIT]}")
    figures = fit.get("auroc") or {}
    gain = fit.get("filter_gain_auroc")
    if gain is not None:
        measured = (f"AUROC {figures.get('with_filter', 0):.3f} with the filter, "
                    f"{figures.get('priors_alone', 0):.3f} with BM25 + dense alone "
                    f"({gain:+.3f}, {fit.get('questions')} questions, out of fold)")
        lines.append(f"the filter adds nothing: {measured}; MCF ranks by the priors alone"
                     if fit.get("filter_adds_nothing") else measured)
    ece = fit.get("ece") or {}
    if ece.get("platt") is not None:
        lines.append(f"ECE {ece['platt']:.3f} (Platt, used; isotonic "
                     f"{ece.get('isotonic') or 0:.3f})")
    if (fit.get("rule") or {}).get("features"):
        rule = fit["rule"]
        lines.append(f"chosen leave-one-source-out among {len(fit.get('candidates') or [])} "
                     f"rules: {rule['features'].replace('_', ' ')}, min_keep "
                     f"{rule['min_keep']}, top_k {rule['top_k']}, "
                     + ("no guard" if rule.get("guard_level") is None
                        else f"guard level {rule['guard_level']:g}"))
    for source, row in (fit.get("leave_one_source_out") or {}).items():
        cells = "; ".join(
            f"{rule.replace('_', ' ')} F1 {row[rule]['f1']:.3f} ({row[rule]['margin']:+.3f}), "
            f"ECE {row[rule]['ece']:.3f}" for rule in ("default", "with_filter", "priors_alone")
            if rule in row)
        lines.append(f"{source} left out of the fit ({row['questions']} q; retrieval top-k F1 "
                     f"{row['retrieval_top_k_f1']:.3f}): {cells}")
    return "\n".join(lines)


def filter_role(combination: Combination) -> str:
    """What ranks and what the filter does under `combination`, in one plain line (the
    demo's closing line)."""
    fit = combination.report.get("fit") or {}
    gain, questions = fit.get("filter_gain_auroc"), fit.get("questions")
    sources = len(fit.get("leave_one_source_out") or {}) or len(fit.get("by_source") or {})
    measured = (f"{_gain_words(fit)} on {questions} questions from {sources} source(s)"
                if gain is not None else "")
    sentences = ("what the filter still does: name each kept passage's key sentences "
                 "(--mcf.sentence-stage, or the proxy's granularity \"sentence\")")
    if not combination.fitted:
        return ("the filter's own score ranks (its card holds no fitted combination)"
                if combination.reads_filter() else "retrieval ranks: z(BM25) + z(dense)")
    if combination.reads_filter():
        return (f"the filter's score ranks with BM25 and dense, calibrated: it adds {measured}"
                if measured else "the filter's score ranks with BM25 and dense, calibrated")
    return (f"retrieval ranks (BM25 + dense, calibrated): the filter's score added {measured}, "
            f"so it is left out of the ranking; {sentences}")


def _gain_words(fit: Mapping[str, Any]) -> str:
    """What the filter added over BM25 + dense in a fit report, against what it must add."""
    added = f"{fit['filter_gain_auroc']:+.4f} AUROC over BM25 + dense"
    if fit.get("filter_gain_meets_min_gain") is False or fit.get("filter_adds_nothing"):
        return f"{added}, under the {fit.get('min_gain', 0.005):g} it must add"
    return added


def ranking_statement(combination: Combination, where: str, *, priors_only: bool = False,
                      score_rule: str = "combined", lexical_weight: float | None = None,
                      always_score: bool = False, home: str = "auto") -> str:
    """The line every command that ranks by a filter prints at start (`_ranking_words`),
    saying too when no chunk is sent to the filter (its score unused and `always_score`,
    `mcf.always_score_chunks`, off), and where the card's home rule ranks instead (`home`:
    `mcf.home`)."""
    words = _ranking_words(combination, where, priors_only=priors_only,
                           score_rule=score_rule, lexical_weight=lexical_weight)
    called = (PRIORS_ONLY if priors_only else combination).reads_filter(score_rule,
                                                                         always_score)
    rule = combination.home
    at_home = rule is not None and not priors_only and score_rule == "combined"
    if at_home and home == "home":
        return (f"MCF ranks every round by the home combination of {where} "
                f"({', '.join(rule.sources)}), as --mcf.home home asks: the filter reads the "
                f"priors' best {rule.read} passages of each round")
    words += ("" if called else
              "; no chunk is sent to the filter (--mcf.always-score-chunks sends them)")
    if at_home and home == "auto" and rule.test.bar < 1.0:
        words += (f"; a round that looks like the filter's home text ({', '.join(rule.sources)}"
                  f": P(home) >= {rule.test.bar:g}, tested on retrieval's features) ranks by "
                  f"the home combination instead, the filter reading the priors' best "
                  f"{rule.read} passages (--mcf.home away never, home always)")
    return words


def _ranking_words(combination: Combination, where: str, *, priors_only: bool,
                   score_rule: str, lexical_weight: float | None) -> str:
    """The line every command that ranks by a filter prints at start: which score MCF ranks
    passages by, and why. `combination`: the filter card's (`card_combination`); `where`:
    where that card was read, or why there is none; `priors_only`: `--mcf.combination
    priors_only` asked for the card's priors-only fit; `score_rule`: MCF's
    (`MCFConfig.score_rule`: combined, filter or fused, with `lexical_weight`)."""
    if score_rule == "filter":
        return ("MCF ranks by the filter's own score s = log P(Yes) - log P(No), as "
                "--mcf.lexical-weight 0 or --mcf.bar fixed asks, not by the combination of "
                f"{where}")
    if score_rule == "fused":
        return (f"MCF ranks by z(s) + {lexical_weight:g}·z(BM25), the fixed fusion "
                f"--mcf.lexical-weight {lexical_weight:g} asks for, not by the combination of "
                f"{where}")
    if priors_only and combination.fitted:  # unfitted, MCF refuses priors_only by name
        return (f"MCF ranks by BM25 + dense alone, the priors-only fit of {where}, as "
                "--mcf.combination priors_only asks (the filter's score unused)")
    if not combination.fitted:
        if combination.reads_filter():
            return (f"MCF ranks by the filter's own score, its P(Yes) normalised over Yes "
                    f"and No (no fitted calibration): {where} holds no fitted combination with "
                    "BM25 and dense; fit one with `sieverag filter fit-combination`")
        return ("MCF ranks by BM25 + dense alone, z(BM25) + z(dense) uncalibrated, the "
                f"filter's score unused: {where}")
    fit = combination.report.get("fit") or {}
    questions = f"{fit['questions']} question(s)" if fit.get("questions") else "held-out questions"
    if not combination.reads_filter():
        added = ("nothing over them" if fit.get("filter_gain_auroc") is None
                 else _gain_words(fit))
        return (f"MCF ranks by BM25 + dense alone, the combination of {where}: its fit on "
                f"{questions} left the filter's score out (it added {added})")
    if fit.get(FILTER_ALONE_FIT):
        return (f"MCF ranks by the filter's own score, Platt-calibrated on {questions} "
                f"({where}: {fit[FILTER_ALONE_FIT]}); fit its combination with BM25 and dense "
                "on more with `sieverag filter fit-combination`")
    return (f"MCF ranks by the filter's score combined with BM25 and dense, calibrated, as "
            f"fitted on {questions} in {where}")


def describe_home(rule: HomeRule) -> str:
    """What a home rule is and what its fit measured, in a few lines (`filter list`,
    `filter fit-combination`)."""
    fit = rule.report.get("fit") or {}
    combination = rule.combination
    weights = ", ".join(f"{f} {w:+.3f}" for f, w in combination.weights.items() if w)
    lines = [f"home: {', '.join(rule.sources)}; a round is home at P(home) >= "
             f"{rule.test.bar:g} (its question and passages' embeddings); there the filter "
             f"reads the priors' best {rule.read} passages and ranks by logit = "
             f"{combination.bias:+.3f} + {weights}"
             + (f", calibrated bar P(relevant) >= {combination.bar:g}, at least "
                f"{combination.min_keep} kept" if combination.bar is not None else "")]
    if rule.test.dataset_bar is not None:
        lines.append(f"a whole dataset is home at mean P(home) >= {rule.test.dataset_bar:.3g} "
                     "(eval-filter decides each dataset first)")
    if fit.get("cross_validated_f1") is not None:
        lines.append(f"home questions: {fit.get('questions')}, cross-validated F1 "
                     f"{fit['cross_validated_f1']:.3f} at home; gold passages read "
                     f"{fit.get('gold_read')}/{fit.get('gold')}; home test AUROC "
                     f"{fit.get('test_auroc_out_of_fit') or 0:.3f} (out of fit)")
    chosen = next((row for row in fit.get("bars") or () if row["bar"] == rule.test.bar), None)
    if chosen is None and rule.test.bar >= 1.0:
        lines.append("no bar kept every away source from losing: no round is called home")
    elif chosen is not None:
        home = chosen["home"]
        lines.append(f"at the bar: {home['called_home']:.0%} of home questions called home, "
                     f"F1 {home['f1']:.3f} against {home['f1_away_only']:.3f} away-only")
        lines += [f"{source} left out of the test: {row['called_home']:.0%} called home, "
                  f"F1 change {0.0 - (row['f1_loss'] or 0.0) + 0.0:+.3f}"
                  for source, row in chosen["sources"].items()]
    return "\n".join(lines)
