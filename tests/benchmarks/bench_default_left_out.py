"""The default selection on text no fit saw (issue 53): every source left out in turn.

For each source, each candidate rule (`training/evaluation/combination_fit.CANDIDATES`: the
combination with the filter or the priors alone, min_keep, the shift guard's top_k and level) is
fitted on every other source (weights, bar, guard ranges) and measured on the one left out; the
default is the rule whose worst left-out source is best (`measure_combination`, the same call
`sieverag filter fit-combination --by-left-out-source` makes). Side by side per source, in one
run: BM25's and dense's top-2 F1, the default's F1 at its own bar, its margin over the better
top-2, ECE, passages kept, the share of rounds its shift guard decided, and beside it the same
rule without the guard and the best rule with the filter.

The scored passages come from a `--scores` file that `fit-combination --scores` writes (the
filter run once; this script then takes seconds), or are scored here with the shipped filter:

    python tests/benchmarks/filter_sources.py --data ../shared/data --out runs/sources
    python tests/benchmarks/bench_default_left_out.py --scores runs/left-out/scores.jsonl \\
        --dataset ../shared/data/hotpotqa_distractor.jsonl,runs/sources/nq.jsonl,...

Ends with one line of JSON; `--results-json PATH` also writes the table of
docs/results/filter.md (docs/results/data/left_out.json).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import results_json

from sieverag.inference.filters.adapter_store import find_adapter, resolve_filter
from sieverag.inference.filters.card.card_file import read_card
from sieverag.inference.metrics.filter_scores import top_k_indices
from sieverag.training.evaluation.card_fit import score_fitting_rounds
from sieverag.training.evaluation.combination_fit import (
    TOP_K,
    SelectionRule,
    fit_rule,
    fitting_questions,
    measure_combination,
    measured_on,
    rounds_f1,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, help="comma-separated gold-marked sets")
    parser.add_argument("--scores", default=None, help="scored rounds kept across runs")
    parser.add_argument("--filter", default="smollm2-filter")
    parser.add_argument("--limit", type=int, default=60, help="questions a source")
    parser.add_argument("--quick", action="store_true", help="10 questions a source")
    results_json.add_option(parser)
    args = parser.parse_args()
    limit = 10 if args.quick else args.limit
    found = find_adapter(args.filter)
    card = read_card(found.path) or {}
    folder = resolve_filter(str(found.path), card["base_model"])
    started = time.perf_counter()
    by_dataset = fitting_questions(args.dataset.split(","), card, adapter=args.filter,
                                   limit=limit)
    rounds = score_fitting_rounds(folder, card, by_dataset, scores_file=args.scores,
                                  progress=False)
    scored = time.perf_counter() - started
    combination = measure_combination(rounds, by_left_out_source=True)
    fit = combination.report["fit"]
    rule = SelectionRule(**fit["rule"])
    unguarded = replace(rule, guard_level=None)
    sources = sorted({r.source for r in rounds})
    table = {}
    for source in sources:
        train = [r for r in rounds if r.source != source]
        held = [r for r in rounds if r.source == source]
        row = fit["leave_one_source_out"][source]
        bm25, dense = (rounds_f1(held, [set(top_k_indices(values(r), TOP_K)) for r in held])
                       for values in (lambda r: r.scores.bm25, lambda r: r.scores.dense))
        table[source] = {
            "questions": len(held), "bm25_top2_f1": bm25, "dense_top2_f1": dense,
            "default": row["default"], "with_filter": row["with_filter"],
            "without_guard": measured_on(fit_rule(unguarded, train), held)}
    print(f"{len(rounds)} questions from {len(sources)} sources "
          f"({scored:.0f} s to score or read them); default chosen left out: {rule.name}; "
          f"the filter's cross-validated AUROC gain {fit['filter_gain_auroc']:+.4f} "
          f"(must be >= {fit['min_gain']:g}: "
          f"{'met' if fit['filter_gain_meets_min_gain'] else 'not met, the filter left out'})")
    header = (f"{'left out':18}{'q':>4}{'BM25 top-2':>11}{'dense top-2':>12}{'default F1':>11}"
              f"{'margin':>8}{'ECE':>7}{'kept/q':>8}{'guarded':>8}{'no guard':>9}"
              f"{'w/ filter':>10}")
    print(header)
    for source, row in table.items():
        default = row["default"]
        print(f"{source:18}{row['questions']:>4}{row['bm25_top2_f1']:>11.3f}"
              f"{row['dense_top2_f1']:>12.3f}{default['f1']:>11.3f}{default['margin']:>+8.3f}"
              f"{default['ece']:>7.3f}{default['kept_per_question']:>8.2f}"
              f"{default['guarded']:>8.2f}{row['without_guard']['f1']:>9.3f}"
              f"{row['with_filter']['f1']:>10.3f}")
    worst = min(row["default"]["margin"] for row in table.values())
    print(f"worst left-out margin over the better top-2: {worst:+.3f}; worst ECE "
          f"{max(row['default']['ece'] for row in table.values()):.3f}")
    print(json.dumps({"rule": fit["rule"], "filter_gain_auroc": fit["filter_gain_auroc"],
                      "questions": len(rounds), "worst_margin": worst,
                      "sources": {s: {"questions": r["questions"],
                                      "bm25_top2_f1": round(r["bm25_top2_f1"], 4),
                                      "dense_top2_f1": round(r["dense_top2_f1"], 4),
                                      **{f"{k}_{m}": round(r[k][m], 4)
                                         for k in ("default", "without_guard", "with_filter")
                                         for m in ("f1", "margin", "ece", "kept_per_question",
                                                   "guarded")}}
                                  for s, r in table.items()}}))
    if args.results_json:
        results_json.write(args.results_json, {"main": results_table(table)})


def results_table(table: dict) -> dict:
    """The left-out table of docs/results/filter.md: a row per source left out."""
    return results_json.table(
        ["left out", "q", "BM25 top-2 F1", "dense top-2 F1", "default F1",
         "margin over the better", "ECE", "kept/q", "rounds guarded", "same rule, no guard",
         "best rule with the filter"],
        [[source, row["questions"], row["bm25_top2_f1"], row["dense_top2_f1"],
          row["default"]["f1"], row["default"]["margin"], row["default"]["ece"],
          row["default"]["kept_per_question"], row["default"]["guarded"],
          row["without_guard"]["f1"], row["with_filter"]["f1"]]
         for source, row in table.items()],
        align=["", *["right"] * 10],
        formats=[None, "d", ".3f", ".3f", ".3f", "+.3f", ".3f", ".2f", ".2f", ".3f", ".3f"])


if __name__ == "__main__":
    main()
