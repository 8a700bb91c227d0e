"""Where MCF's default calls its score a probability (issue 65, item 5): every source left out
in turn, as it is and with its base rate moved.

The card's default rule (the rule `filter fit-combination --by-left-out-source` chose: its
features, min_keep, top_k and shift-guard level, read from the card) is fitted on every source
but one and measured on the one left out (`combination_fit.measured_on`): the expected
calibration error (ECE) of its P(relevant) over every round, over the rounds MCF calls
calibrated (`Combination.calibrated_on`: the shift guard finds them like the fitting rounds;
on the others `/v1/rerank` answers `calibrated: false` and traces say "not calibrated here"),
and the share of rounds it calls calibrated. Then the same on the left-out source's rounds with
their base rate moved to `--base-rate` (non-gold passages dropped at random, each passage
keeping the BM25 and dense scores it had in its whole round): RGB's web snippets hold 3.8
relevant passages in 10, against about 2 in the fitting sources, and their ECE was 0.245.

A default that reads only BM25 and dense (the shipped card's) needs no filter: the rounds are
scored here in seconds. A default that reads the filter needs its scores (`--scores`, the file
`fit-combination --scores` writes).

    python tests/benchmarks/filter_sources.py --data ../shared/data --out runs/sources
    python tests/benchmarks/bench_calibration.py \\
        --dataset ../shared/data/hotpotqa_distractor.jsonl,runs/sources/nq.jsonl,... \\
        --results-json docs/results/data/calibration.json

Ends with one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import replace

import results_json

from sieverag.inference.data import example_source
from sieverag.inference.filters.adapter_store import find_adapter, resolve_filter
from sieverag.inference.filters.card.card_file import read_card
from sieverag.inference.filters.card.combination import RoundScores, passage_priors
from sieverag.training.evaluation.card_fit import score_fitting_rounds
from sieverag.training.evaluation.combination_fit import (
    LabelledRound,
    SelectionRule,
    fit_rule,
    fitting_questions,
    measured_on,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, help="comma-separated gold-marked sets")
    parser.add_argument("--filter", default="smollm2-filter")
    parser.add_argument("--scores", default=None,
                        help="scored rounds (needed where the default reads the filter)")
    parser.add_argument("--limit", type=int, default=60, help="questions a source")
    parser.add_argument("--quick", action="store_true", help="15 questions a source")
    parser.add_argument("--base-rate", type=float, default=0.38,
                        help="the moved base rate (share of relevant passages in a round)")
    results_json.add_option(parser)
    args = parser.parse_args()
    if not 0.0 < args.base_rate < 1.0:
        parser.error(f"--base-rate must be in (0, 1), got {args.base_rate}")
    found = find_adapter(args.filter)
    card = read_card(found.path) or {}
    fit = (card.get("combination") or {}).get("fit") or {}
    if "rule" not in fit:
        parser.error(f"{found.path}'s card records no default rule: refit it with "
                     "`sieverag filter fit-combination --by-left-out-source`")
    rule = SelectionRule(**fit["rule"])
    limit = 15 if args.quick else args.limit
    started = time.perf_counter()
    by_dataset = fitting_questions(args.dataset.split(","), card, adapter=args.filter,
                                   limit=limit)
    if rule.features == "priors_alone":
        rounds = priors_rounds(by_dataset, card["combination"]["embedding_model"])
    elif args.scores is None:
        parser.error(f"the card's default ({rule.name}) reads the filter: give its scores "
                     "with --scores (the file `sieverag filter fit-combination --scores` "
                     "writes)")
    else:
        folder = resolve_filter(str(found.path), card["base_model"])
        rounds = score_fitting_rounds(folder, card, by_dataset, scores_file=args.scores,
                                      progress=False)
    scored = time.perf_counter() - started
    sources = sorted({r.source for r in rounds})
    table = {}
    for source in sources:
        train = [r for r in rounds if r.source != source]
        held = [r for r in rounds if r.source == source]
        moved = moved_base_rate(held, args.base_rate)
        default = fit_rule(rule, train)
        table[source] = {"questions": len(held), "base_rate": base_rate(held),
                         "as_is": measured_on(default, held),
                         "moved_base_rate": base_rate(moved),
                         "moved": measured_on(default, moved)}
    print(f"{len(rounds)} questions from {len(sources)} sources ({scored:.0f} s to score "
          f"them); the card's default, fitted on the other sources each time: {rule.name}")
    print(f"{'':28}{'-------- as it is --------':>33}   "
          f"{'--- base rate moved ---':>33}")
    print(f"{'left out':18}{'q':>4}{'rate':>6}{'ECE':>7}{'ECE called':>11}{'called':>8}"
          f"{'':3}{'rate':>6}{'ECE':>7}{'ECE called':>11}{'called':>8}")
    for source, row in table.items():
        now, moved = row["as_is"], row["moved"]
        print(f"{source:18}{row['questions']:>4}{row['base_rate']:>6.2f}{now['ece']:>7.3f}"
              f"{_shown(now['ece_calibrated']):>11}{now['calibrated']:>8.2f}{'':3}"
              f"{row['moved_base_rate']:>6.2f}{moved['ece']:>7.3f}"
              f"{_shown(moved['ece_calibrated']):>11}{moved['calibrated']:>8.2f}")
    called = [r["as_is"]["ece_calibrated"] for r in table.values()
              if r["as_is"]["ece_calibrated"] is not None]
    print(f"worst ECE where called calibrated: {max(called):.3f}; share of moved rounds "
          f"called calibrated: {min(r['moved']['calibrated'] for r in table.values()):.2f}–"
          f"{max(r['moved']['calibrated'] for r in table.values()):.2f}")
    print(json.dumps({"rule": fit["rule"], "questions": len(rounds),
                      "base_rate_moved_to": args.base_rate,
                      "sources": {s: {"questions": r["questions"],
                                      "base_rate": round(r["base_rate"], 4),
                                      "moved_base_rate": round(r["moved_base_rate"], 4),
                                      **{f"{k}_{m}": _rounded(r[k][m])
                                         for k in ("as_is", "moved")
                                         for m in ("ece", "ece_calibrated", "calibrated")}}
                                  for s, r in table.items()}}))
    if args.results_json:
        results_json.write(args.results_json, {"main": results_table(table)})


def priors_rounds(by_dataset: dict, embedding_model: str) -> list[LabelledRound]:
    """Each question's passages scored by BM25 and dense as MCF scores them
    (`passage_priors`), the filter's score unknown (0: a priors-only default reads none)."""
    rounds = []
    for examples in by_dataset.values():
        for example in examples:
            bm25, dense = passage_priors(example.question,
                                         [d.as_context() for d in example.documents],
                                         embedding_model)
            rounds.append(LabelledRound(
                RoundScores((0.0,) * len(bm25), tuple(bm25), tuple(dense)),
                tuple(bool(d.is_gold) for d in example.documents), example_source(example),
                example.id))
    return rounds


def moved_base_rate(rounds: list[LabelledRound], rate: float, seed: int = 0
                    ) -> list[LabelledRound]:
    """`rounds` with non-gold passages dropped at random until about `rate` of each round is
    gold (at least one non-gold kept); each passage keeps its scores."""
    rng = random.Random(seed)
    moved = []
    for r in rounds:
        gold = [i for i, g in enumerate(r.labels) if g]
        other = [i for i, g in enumerate(r.labels) if not g]
        keep = max(1, round(len(gold) * (1 - rate) / rate))
        chosen = sorted(gold + rng.sample(other, min(keep, len(other))))
        scores = RoundScores(*(tuple(column[i] for i in chosen) for column in
                               (r.scores.filter_log_odds, r.scores.bm25, r.scores.dense)))
        moved.append(replace(r, scores=scores, labels=tuple(r.labels[i] for i in chosen)))
    return moved


def base_rate(rounds: list[LabelledRound]) -> float:
    labels = [v for r in rounds for v in r.labels]
    return sum(labels) / max(len(labels), 1)


def _shown(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def results_table(table: dict) -> dict:
    """The calibration table of docs/results/filter.md: a row per source left out."""
    return results_json.table(
        ["left out", "q", "base rate", "ECE, every round", "ECE, rounds called calibrated",
         "called calibrated", "moved base rate", "ECE, every round (moved)",
         "ECE, called calibrated (moved)", "called calibrated (moved)"],
        [[source, row["questions"], row["base_rate"], row["as_is"]["ece"],
          row["as_is"]["ece_calibrated"], row["as_is"]["calibrated"], row["moved_base_rate"],
          row["moved"]["ece"], row["moved"]["ece_calibrated"], row["moved"]["calibrated"]]
         for source, row in table.items()],
        align=["", *["right"] * 9],
        formats=[None, "d", ".2f", ".3f", ".3f", ".2f", ".2f", ".3f", ".3f", ".2f"])


if __name__ == "__main__":
    main()
