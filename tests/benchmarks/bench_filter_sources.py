"""Filters trained on different labels, side by side on the same held-out passages of several
sources: the label ablation and the cross-source table of the filter-generalization work.

Each `--arm NAME=ADAPTER` is a trained filter (a folder or a filter name); every arm is run
through `sieverag eval-filter` (the real MCF, no judge row) on the same datasets, with the
same questions left out: the train splits of every `--exclude-training` folder (give every
arm's build-dataset output, so no arm is scored on a question any arm trained on). Model work
is cached per arm under `--out`, so a rerun only adds what is new.

    python tests/benchmarks/bench_filter_sources.py \
        --arm gold-hotpot=smollm2-filter --arm policy=runs/filter-policy \
        --dataset HOTPOT.jsonl,runs/sources/nq.jsonl --exclude-training runs/dataset-policy \
        [--held-out-source no-squad=squad] [--limit 40] [--out runs/bench-filter-sources]

`--held-out-source ARM=SOURCE` says an arm was trained without SOURCE: the cross-source table
lists that arm on that source's datasets beside BM25. Prints one table per figure (rows:
datasets, columns: arms and the lexical / dense baselines), each arm's per-source table of
the filter alone, the priors alone and the default (the row amber runs, labelled "default"),
and one JSON line.
`--quick`: 5 questions per dataset.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from offline_env import run_offline

run_offline()

from sieverag.inference.composition.config import ModelRoles  # noqa: E402
from sieverag.inference.llm.backend_registry import BackendSpec  # noqa: E402
from sieverag.training.evaluation.filter_eval import run_filter_eval  # noqa: E402
from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig  # noqa: E402
from sieverag.training.evaluation.filter_report import summary_table  # noqa: E402

FIGURES = (("filter_auroc", "AUROC (filter alone: score s, no prior)"),
           ("default_auroc", "AUROC (default: the card's combination of s, BM25 and dense)"),
           ("filter_top_k_f1", "chunk F1, MCF top-k (filter alone)"),
           ("amber_default_f1", "chunk F1, default (combination at its calibrated bar)"),
           ("default_ece", "ECE of the default's P(relevant)"),
           ("fixed_bar_kept_per_question", "passages kept per question at the fixed bar "
                                           "(P(Yes) > P(No))"),
           ("sentence_stage_f1", "sentence F1, MCF top-k -> sentence stage"))


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        name, sep, target = value.partition("=")
        if not sep or not name or not target:
            raise SystemExit(f"{flag} expects NAME=VALUE, got {value!r}")
        pairs[name] = target
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", action="append", required=True, help="NAME=ADAPTER")
    parser.add_argument("--dataset", required=True, help="comma-separated dataset files")
    parser.add_argument("--exclude-training", required=True,
                        help="comma-separated build-dataset folders of every arm")
    parser.add_argument("--held-out-source", action="append", default=[],
                        help="ARM=SOURCE: the arm was trained without SOURCE")
    parser.add_argument("--limit", type=int, default=None, help="questions per dataset")
    parser.add_argument("--out", default="runs/bench-filter-sources")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    arms = _pairs(args.arm, "--arm")
    held_out = _pairs(args.held_out_source, "--held-out-source")
    unknown = set(held_out) - set(arms)
    if unknown:
        raise SystemExit(f"--held-out-source names no arm: {', '.join(sorted(unknown))}")
    datasets = tuple(d for d in args.dataset.split(",") if d)
    limit = 5 if args.quick else args.limit

    reports = {}
    for name, adapter in arms.items():
        print(f"== {name}: {adapter}", file=sys.stderr, flush=True)
        reports[name] = run_filter_eval(FilterEvalConfig(
            dataset=datasets, out=str(Path(args.out) / name), judge=False, limit=limit,
            models=ModelRoles(filter=BackendSpec(adapter=adapter)),
            exclude_training=tuple(args.exclude_training.split(","))), progress=False)

    names = list(next(iter(reports.values()))["by_dataset"])
    sources = {n: next(iter(reports.values()))["datasets"][n]["sources"] for n in names}
    first = next(iter(reports.values()))["by_dataset"]
    print("questions per dataset: " + ", ".join(
        f"{n} {first[n]['questions']} ({first[n]['passages']} passages, {first[n]['gold']} "
        "gold)" for n in names))
    for arm, report in reports.items():
        print(f"\n{arm}: the filter alone, the priors alone (BM25, dense) and the default "
              "(amber's MCF rule), per source")
        print(summary_table(report["by_dataset"]))
    for key, title in FIGURES:
        columns = list(arms)
        if key in ("filter_auroc", "default_auroc"):
            columns += ["BM25", "dense"]
        elif key in ("filter_top_k_f1", "amber_default_f1"):
            columns += ["BM25", "dense"]
        print(f"\n{title}\n| dataset | " + " | ".join(columns) + " |\n|---|"
              + "---:|" * len(columns))
        for dataset in names:
            cells = [reports[arm]["by_dataset"][dataset][key] for arm in arms]
            if key in ("filter_auroc", "default_auroc"):
                cells += [first[dataset]["bm25_auroc"], first[dataset]["dense_auroc"]]
            elif key in ("filter_top_k_f1", "amber_default_f1"):
                cells += [first[dataset]["bm25_top_k_f1"], first[dataset]["dense_top_k_f1"]]
            print(f"| {dataset} | " + " | ".join(
                "–" if c is None else f"{c:.3f}" for c in cells) + " |")
    cross = {arm: {d: {"filter_auroc": reports[arm]["by_dataset"][d]["filter_auroc"],
                       "bm25_auroc": first[d]["bm25_auroc"]}
                   for d in names if source in sources[d]}
             for arm, source in held_out.items()}
    if cross:
        print("\ncross-source: an arm on the source it was trained without")
        print("| arm | held-out source | dataset | filter AUROC | BM25 AUROC |\n|---|---|---|"
              "---:|---:|")
        for arm, rows in cross.items():
            for dataset, figures in rows.items():
                print(f"| {arm} | {held_out[arm]} | {dataset} | {figures['filter_auroc']:.3f} "
                      f"| {figures['bm25_auroc']:.3f} |")
    print(json.dumps({
        "arms": {arm: {d: {k: r["by_dataset"][d][k] for k, _ in FIGURES} for d in names}
                 for arm, r in reports.items()},
        "bm25_auroc": {d: first[d]["bm25_auroc"] for d in names},
        "dense_auroc": {d: first[d]["dense_auroc"] for d in names},
        "bm25_top_k_f1": {d: first[d]["bm25_top_k_f1"] for d in names},
        "dense_top_k_f1": {d: first[d]["dense_top_k_f1"] for d in names},
        "cross_source": cross,
    }))


if __name__ == "__main__":
    main()
