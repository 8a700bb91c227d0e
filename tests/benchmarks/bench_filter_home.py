"""The filter where it knows the text (issue 65): the home rule fitted, its bar chosen with
each away source left out, and the home source's held-out questions.

The home rule is fitted as `sieverag filter fit-combination ADAPTER --dataset SETS
--keep-combination` fits it (`training/evaluation/card_fit.fit_card_home`, the same call): the
filter's home sources' first `--limit` fitting questions (not its training questions) are home, the
other datasets' first `--limit` are away; the card's combination is the away default. Then,
side by side on the home source's questions outside the fit (held out), per question:

* the away default alone (today's default: the card's combination);
* the default with the home rule (the home test decides each round);
* the home rule on every round (what `--mcf.home home` gives);
* the home combination fitted on all ten passages instead of the priors' best five (what
  reading fewer passages costs);
* filter + BM25 (w = 1), top 2: z(s) + z(BM25), the arm the issue compares with;
* BM25's and dense's top 2.

The scored passages come from `--scores` (the file `fit-combination --scores` keeps), so a
rerun takes seconds; the filter's passage reads per question are counted from the rule.

    python tests/benchmarks/filter_sources.py --data ../shared/data --out runs/sources
    python tests/benchmarks/bench_filter_home.py --home ../shared/data/hotpotqa_distractor.jsonl \\
        --away runs/sources/nq.jsonl,runs/sources/squad.jsonl,... --scores runs/home/scores.jsonl

Ends with one line of JSON; `--results-json PATH` writes the tables of docs/results/filter.md
(docs/results/data/filter_home.json).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np
import results_json

from sieverag.inference.data import example_source
from sieverag.inference.filters.adapter_store import find_adapter, resolve_filter
from sieverag.inference.filters.card.card_file import read_card
from sieverag.inference.filters.card.combination import card_combination
from sieverag.inference.filters.document_filter import z_scores
from sieverag.inference.metrics.filter_scores import top_k_indices
from sieverag.training.evaluation.card_fit import (
    fit_card_home,
    home_sources_of,
    score_fitting_rounds,
)
from sieverag.training.evaluation.combination_fit import fitting_questions
from sieverag.training.evaluation.home_fit import (
    f1_of,
    fit_home_combination,
    kept_at_home,
    kept_away,
    read_round,
    round_features,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", required=True, help="the home source's gold-marked set")
    parser.add_argument("--away", required=True, help="comma-separated sets of other sources")
    parser.add_argument("--scores", default=None, help="scored rounds kept across runs")
    parser.add_argument("--filter", default="smollm2-filter")
    parser.add_argument("--limit", type=int, default=60, help="fitting questions a source")
    parser.add_argument("--read", type=int, default=5, help="passages a home round reads")
    parser.add_argument("--quick", action="store_true", help="15 questions a source")
    results_json.add_option(parser)
    args = parser.parse_args()
    limit = 15 if args.quick else args.limit
    found = find_adapter(args.filter)
    card = dict(read_card(found.path) or {})
    card.pop("home", None)  # fitted here afresh
    folder = resolve_filter(str(found.path), card["base_model"])
    away_default = replace(card_combination(card, str(folder)), home=None)
    sources = home_sources_of(card)
    started = time.perf_counter()
    datasets = [args.home, *args.away.split(",")]
    by_dataset = fitting_questions(datasets, card, adapter=args.filter, limit=limit)
    rule = fit_card_home(folder, card, by_dataset, away_default, home_sources=sources,
                         read=args.read, scores_file=args.scores, progress=False)
    fitted = time.perf_counter() - started
    fit = rule.report["fit"]
    print(f"home {', '.join(sources)}: {fit['questions']} questions; away: "
          + ", ".join(f"{s} {n}" for s, n in fit["away_questions"].items())
          + f" ({fitted:.0f} s to fit, scoring included); home test AUROC out of fit "
          f"{fit['test_auroc_out_of_fit']:.3f}; home combination: rule {fit['rule']}, "
          f"cross-validated F1 {fit['cross_validated_f1']:.3f}, gold read "
          f"{fit['gold_read']}/{fit['gold']}")
    bars_table = bars_rows(fit["bars"])
    print(results_json.markdown(bars_table))
    print(f"chosen bar: P(home) >= {rule.test.bar:g}; mean P(home) out of fit: "
          + ", ".join(f"{k} {v:.3f}" for k, v in fit["mean_p_home_out_of_fit"].items())
          + f"; dataset bar: {rule.test.dataset_bar}")

    # Held out: the home source's questions outside the fit.
    fitted_ids = {e.id for e in by_dataset[args.home]}
    everything = fitting_questions([args.home], card, adapter=args.filter)[args.home]
    held = [e for e in everything if e.id not in fitted_ids]
    rounds = score_fitting_rounds(folder, card, {args.home: held}, scores_file=args.scores,
                                  progress=False)
    fit_examples = [e for e in by_dataset[args.home] if example_source(e) in sources]
    fit_rounds = score_fitting_rounds(folder, card, {args.home: fit_examples},
                                      scores_file=args.scores, progress=False)
    all_ten, _, _ = fit_home_combination(
        [read_round(e, r, 10 ** 6) for e, r in zip(fit_examples, fit_rounds, strict=True)])
    arms: dict[str, list[float]] = {name: [] for name in ARMS}
    p_homes = [rule.test.probability_of(round_features(e)) for e in held]
    dataset_home = (rule.test.dataset_bar is not None
                    and float(np.mean(p_homes)) >= rule.test.dataset_bar)
    called = []
    for example, scored, p_home in zip(held, rounds, p_homes, strict=True):
        gold = {i for i, g in enumerate(scored.labels) if g}
        reading = read_round(example, scored, rule.read)
        called.append(p_home >= rule.test.bar)
        home_kept = kept_at_home(rule.combination, reading)
        away_kept = kept_away(away_default, scored)
        s, bm25, dense = (scored.scores.filter_log_odds, scored.scores.bm25,
                          scored.scores.dense)
        fused = [a + b for a, b in zip(z_scores(list(s)), z_scores(list(bm25)), strict=True)]
        for name, kept in (
                ("away default (today)", away_kept),
                ("default with the home rule", home_kept if called[-1] else away_kept),
                ("default, the dataset decided (eval-filter)",
                 home_kept if dataset_home or called[-1] else away_kept),
                ("home rule on every round", home_kept),
                ("home combination reading all ten",
                 kept_at_home(all_ten, read_round(example, scored, 10 ** 6))),
                ("filter + BM25 (w = 1), top 2", set(top_k_indices(fused, 2))),
                ("BM25 top 2", set(top_k_indices(list(bm25), 2))),
                ("dense top 2", set(top_k_indices(list(dense), 2)))):
            arms[name].append(f1_of(kept, gold))
    reads = {"away default (today)": 0.0,
             "default with the home rule": rule.read * float(np.mean(called)),
             "default, the dataset decided (eval-filter)":
                 float(rule.read) if dataset_home else rule.read * float(np.mean(called)),
             "home rule on every round": float(rule.read),
             "home combination reading all ten": float(np.mean(
                 [len(e.documents) for e in held])),
             "filter + BM25 (w = 1), top 2": float(np.mean([len(e.documents) for e in held])),
             "BM25 top 2": 0.0, "dense top 2": 0.0}
    held_table = results_json.table(
        ["held out", "q", "F1", "filter reads a question"],
        [[name, len(values), float(np.mean(values)), reads[name]]
         for name, values in arms.items()],
        align=["", "right", "right", "right"], formats=[None, "d", ".3f", ".1f"])
    print(f"\n{len(held)} held-out {', '.join(sources)} questions (outside the fit); "
          f"{np.mean(called):.0%} called home by the test at {rule.test.bar:g}; their mean "
          f"P(home) {np.mean(p_homes):.3f} (dataset bar {rule.test.dataset_bar})")
    print(results_json.markdown(held_table))
    chosen = next(r for r in fit["bars"] if r["bar"] == rule.test.bar) \
        if rule.test.bar < 1.0 else None
    print(json.dumps({
        "home": sources, "bar": rule.test.bar, "read": rule.read,
        "test_auroc_out_of_fit": round(fit["test_auroc_out_of_fit"], 4),
        "fit_questions": fit["questions"], "held_out_questions": len(held),
        "held_out_called_home": round(float(np.mean(called)), 4),
        "held_out_mean_p_home": round(float(np.mean(p_homes)), 4),
        "dataset_bar": rule.test.dataset_bar,
        "mean_p_home_out_of_fit": fit["mean_p_home_out_of_fit"],
        "held_out_f1": {name: round(float(np.mean(v)), 4) for name, v in arms.items()},
        "away_f1_loss_at_bar": ({s: r["f1_loss"] for s, r in chosen["sources"].items()}
                                if chosen else None)}))
    if args.results_json:
        results_json.write(args.results_json, {"bars": bars_table, "held_out": held_table})


ARMS = ("away default (today)", "default with the home rule",
        "default, the dataset decided (eval-filter)", "home rule on every round",
        "home combination reading all ten", "filter + BM25 (w = 1), top 2", "BM25 top 2",
        "dense top 2")


def bars_rows(rows: list[dict]) -> dict:
    """The bar table: per candidate bar, the home questions called home and their F1 (out of
    fit) against away-only, and per away source left out its share called home and F1 change."""
    sources = sorted(rows[0]["sources"]) if rows else []
    return results_json.table(
        ["P(home) bar", "home called", "home F1", "home F1 away-only",
         *[f"{s}: called, F1 change" for s in sources], "every source whole"],
        [[row["bar"], row["home"]["called_home"], row["home"]["f1"],
          row["home"]["f1_away_only"],
          *[_cell(row["sources"][s]) for s in sources], "yes" if row["meets"] else "no"]
         for row in rows],
        align=["right", "right", "right", "right", *["right"] * len(sources), ""],
        formats=[".2f", ".0%", ".3f", ".3f", *[None] * len(sources), None])


def _cell(row: dict) -> str:
    loss = row["f1_loss"]
    change = "–" if loss is None else f"{0.0 - loss + 0.0:+.3f}"
    return f"{row['called_home']:.0%}, {change}"


if __name__ == "__main__":
    main()
