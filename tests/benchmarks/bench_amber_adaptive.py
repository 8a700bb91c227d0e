"""Amber pays its way: the adaptive loop fitted on training questions, then vanilla, the paper's
loop (`amber-paper`), the adaptive default (`amber-mcf`) and `amber-no-amu` side by side on
held-out questions — over an index and on the given passages.

1. **Fit** (training questions, over the index, the `amber-open` preset): `vanilla`,
   `amber-mcf` answering right after round 1 (`--amber.answer-at 0`) and, in a run of its own,
   `amber-mcf` with the adaptive branch off never stopping early (`--no-amber.adaptive
   --amber.collector.sufficiency-threshold 1`: exactly the adaptive loop's "not strong enough"
   branch under the same settings, plus the sufficiency prompt it records; `amber-paper` runs
   the paper's own settings, not these). Each candidate
   sufficiency signal — the sufficiency prompt's P(Yes) after round 1, the kept evidence's
   `max_p` and `sum_p` of MCF's calibrated P(relevant), and their logistic combination — is
   scored as a predictor of "the round-1 answer is right" (AUROC). The adaptive loop answers
   from round 1 where the signal reaches the bar and takes the paper's loop elsewhere, so its
   accuracy and seconds at every bar follow from these two runs question by question; the bar
   chosen is the most accurate one whose seconds stay within 2× vanilla (ties: the cheaper).
2. **Held-out, over the index**: the four pipelines with the chosen signal and bar, and the
   round-1 answer once more (for the signals' held-out AUROC; the sufficiency signal there is
   `amber-paper`'s round-1 verdict, under the paper's settings).
3. **Held-out, given passages** (no index, the default settings: all 10 passages in round 1):
   vanilla, amber-paper, amber-mcf. With every passage seen in round 1 the loop has nothing
   left to fetch (`pool_exhausted`), so both amber rows are MCF + one answer.

    python tests/benchmarks/bench_amber_adaptive.py --dataset hotpotqa_distractor.jsonl \\
        --index runs/open-index --train-ids runs/amber-train-ids.txt \\
        --heldout-ids runs/amber-heldout-ids.txt [--train-limit 30] [--limit 60] \\
        [--set amber.collector.query_source=bridge] [--out runs/bench-adaptive] [--quick]

The index must exist (`bench_open_retrieval.py` builds it). Each step writes its own run
folder under `--out`, and a rerun adds only what is new. Prints the tables and one JSON line;
`--results-json PATH` also writes docs/results/pipelines.md's three held-out tables
(docs/results/data/amber_adaptive.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import results_json  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

from sieverag.inference.cli.run import EvalCommand  # noqa: E402
from sieverag.inference.config import RunConfig  # noqa: E402
from sieverag.inference.eval import runner  # noqa: E402
from sieverag.inference.settings import narrow, parse_settings  # noqa: E402

SIGNALS = ("sufficiency", "max_p", "sum_p", "combined")
HELD_OUT = ("vanilla", "amber-paper", "amber-mcf", "amber-no-amu")


def evaluate(flags: list[str], out: Path) -> dict[str, list[dict]]:
    """One `sieverag eval` run; its records by pipeline."""
    config = narrow(parse_settings(EvalCommand, [*flags, "--no-trust.enabled"],
                                   "bench_amber_adaptive"), RunConfig)
    runner.run_evaluation(config, out, progress=True)
    return {name: [json.loads(line) for line in
                   (out / "results" / f"{name}.jsonl").open(encoding="utf-8")]
            for name in config.pipelines}


def kept_p(record: dict) -> list[float]:
    """MCF's calibrated P(relevant) of the chunks round 1 kept."""
    first = record["trace"]["rounds"][0]
    return [s["p_relevant"] for s in first["scored"] if s["id"] in first["kept"]]


def signals(round_one: dict, paper: dict) -> dict[str, float]:
    """The candidate signals of one question: from the round-1 answer's trace and the paper
    loop's round-1 sufficiency verdict."""
    p = kept_p(round_one)
    verdict = paper["trace"]["rounds"][0].get("sufficiency")
    return {"sufficiency": verdict["p_yes"] if verdict else 0.0,
            "max_p": max(p, default=0.0), "sum_p": sum(p)}


def correct(record: dict) -> bool:
    return bool(record["metrics"]["accuracy"])


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    return (round(float(roc_auc_score(labels, scores)), 3)
            if 0 < sum(labels) < len(labels) else None)


def mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def sufficiency_seconds(record: dict) -> float:
    usage = record["usage"].get("sufficiency")
    return usage["seconds"] if usage else 0.0


def simulate(bar: float, values: Sequence[float], round_one: Sequence[dict],
             paper: Sequence[dict]) -> tuple[float, float]:
    """(accuracy, s/q) of the adaptive loop at `bar`, from the two runs question by question
    (the loop branch is the paper's loop without its sufficiency prompt)."""
    right, seconds = [], []
    for value, first, loop in zip(values, round_one, paper, strict=True):
        strong = value >= bar
        right.append(correct(first) if strong else correct(loop))
        seconds.append(first["seconds"] if strong else loop["seconds"]
                       - sufficiency_seconds(loop))
    return mean(right), mean(seconds)


def table(runs: dict[str, list[dict]], reference: str = "vanilla") -> dict:
    """A row per pipeline: its answers' figures, seconds, their ratio to `reference`'s and
    the share of questions that stopped after round 1."""
    base = mean([r["seconds"] for r in runs[reference]])
    rows = []
    for name, records in runs.items():
        seconds = mean([r["seconds"] for r in records])
        traces = [r.get("trace") or {} for r in records]
        one = [len(t["rounds"]) == 1 for t in traces if "rounds" in t]
        rows.append([name, len(records), mean([r["metrics"]["em"] for r in records]),
                     mean([r["metrics"]["f1"] for r in records]),
                     mean([correct(r) for r in records]), seconds, seconds / base,
                     mean(one) if one else None])
    return results_json.table(
        ["pipeline", "n", "EM", "F1", "Acc", "s/q", "÷ vanilla", "stopped after round 1"], rows,
        align=["", *["right"] * 7], formats=[None, "d", ".3f", ".3f", ".3f", ".2f", ".2f", ".2f"])


def agent_seconds(runs: dict[str, list[dict]]) -> dict:
    """A row per pipeline: the seconds a question each agent's LLM calls took."""
    agents = sorted({a for records in runs.values() for r in records for a in r["usage"]})
    rows = [[name, *[mean([r["usage"][a]["seconds"] if a in r["usage"] else 0.0
                           for r in records]) for a in agents]]
            for name, records in runs.items()]
    return results_json.table(["seconds/q by agent", *agents], rows,
                              align=["", *["right"] * len(agents)],
                              formats=[None, *[".2f"] * len(agents)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--index", default="runs/open-index")
    parser.add_argument("--train-ids", required=True)
    parser.add_argument("--heldout-ids", required=True)
    parser.add_argument("--train-limit", type=int, default=30)
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--set", action="append", default=[],
                        help="KEY=VALUE run setting for every run, e.g. "
                             "amber.collector.query_source=bridge")
    parser.add_argument("--out", default="runs/bench-adaptive")
    parser.add_argument("--skip-given", action="store_true",
                        help="leave out step 3 (the given passages)")
    parser.add_argument("--quick", action="store_true", help="4 questions a step")
    results_json.add_option(parser)
    args = parser.parse_args(argv)
    train_limit, limit = (4, 4) if args.quick else (args.train_limit, args.limit)
    out = Path(args.out)
    settings = [f for s in args.set for f in (f"--{s.partition('=')[0].replace('_', '-')}",
                                              s.partition("=")[2])]
    over_index = ["--preset", "amber-open", "--dataset", args.dataset, "--retrieval.index",
                  args.index, *settings]

    # 1. Fit on training questions.
    training = [*over_index, "--question-ids", args.train_ids, "--limit", str(train_limit)]
    fit = evaluate([*training, "--pipelines", "vanilla,amber-mcf", "--amber.answer-at", "0"],
                   out / "fit")
    paper = evaluate([*training, "--pipelines", "amber-mcf", "--no-amber.adaptive",
                      "--amber.collector.sufficiency-threshold", "1"],
                     out / "fit-loop")["amber-mcf"]
    first = fit["amber-mcf"]
    found = [signals(a, b) for a, b in zip(first, paper, strict=True)]
    labels = [correct(r) for r in first]
    combination = LogisticRegression().fit(
        [[s["sufficiency"], s["sum_p"]] for s in found], labels) if 0 < sum(labels) < len(
            labels) else None
    fit_auroc = {name: auroc([s[name] for s in found], labels) for name in SIGNALS[:3]}
    if combination is not None:
        fit_auroc["combined"] = auroc(combination.decision_function(
            [[s["sufficiency"], s["sum_p"]] for s in found]), labels)
    vanilla_seconds = mean([r["seconds"] for r in fit["vanilla"]])
    choices = []
    for name in ("max_p", "sum_p"):  # the signals the loop can read without an extra call
        values = [s[name] for s in found]
        for bar in sorted({0.0, *values, max(values, default=0.0) + 1}):
            accuracy, seconds = simulate(bar, values, first, paper)
            choices.append((name, bar, accuracy, seconds))
    affordable = [c for c in choices if c[3] <= 2 * vanilla_seconds] or choices
    signal, bar, fit_accuracy, fit_seconds = max(affordable, key=lambda c: (c[2], -c[3]))

    print(f"\n1. Fit on {len(first)} training questions over {args.index}")
    print("| signal (round 1) | AUROC for a right round-1 answer |\n|---|---:|")
    for name, value in fit_auroc.items():
        print(f"| {name} | {'–' if value is None else value} |")
    print(f"vanilla {vanilla_seconds:.2f} s/q, accuracy "
          f"{mean([correct(r) for r in fit['vanilla']]):.3f}; round-1 answer accuracy "
          f"{mean(labels):.3f}; non-adaptive loop accuracy {mean([correct(r) for r in paper]):.3f}")
    print(f"chosen: amber.evidence_signal={signal}, amber.answer_at={bar:.4f} (simulated "
          f"accuracy {fit_accuracy:.3f}, {fit_seconds:.2f} s/q = "
          f"{fit_seconds / vanilla_seconds:.2f}× vanilla)")

    # 2. Held-out, over the index.
    chosen = ["--amber.evidence-signal", signal, "--amber.answer-at", f"{bar:.6f}"]
    held = evaluate([*over_index, *chosen, "--question-ids", args.heldout_ids, "--limit",
                     str(limit), "--pipelines", ",".join(HELD_OUT)], out / "heldout-index")
    once = evaluate([*over_index, "--question-ids", args.heldout_ids, "--limit", str(limit),
                     "--pipelines", "amber-mcf", "--amber.answer-at", "0"],
                    out / "heldout-round1")["amber-mcf"]
    held_found = [signals(a, b) for a, b in zip(once, held["amber-paper"], strict=True)]
    held_labels = [correct(r) for r in once]
    held_auroc = {name: auroc([s[name] for s in held_found], held_labels)
                  for name in SIGNALS[:3]}
    if combination is not None:
        held_auroc["combined"] = auroc(combination.decision_function(
            [[s["sufficiency"], s["sum_p"]] for s in held_found]), held_labels)
    print(f"\n2. Held-out, over the index ({len(held['vanilla'])} questions)")
    tables = {"index": table(held), "agents": agent_seconds(held)}
    print(results_json.markdown(tables["index"]))
    print("\n" + results_json.markdown(tables["agents"]))
    print("\n| signal (round 1) | held-out AUROC for a right round-1 answer |\n|---|---:|")
    for name, value in held_auroc.items():
        print(f"| {name} | {'–' if value is None else value} |")

    # 3. Held-out, given passages.
    given = {}
    if not args.skip_given:
        given = evaluate(["--dataset", args.dataset, *settings, *chosen, "--question-ids",
                          args.heldout_ids, "--limit", str(limit), "--pipelines",
                          "vanilla,amber-paper,amber-mcf"], out / "heldout-given")
        print(f"\n3. Held-out, given passages ({len(given['vanilla'])} questions; every "
              "passage is seen in round 1, so the loop has nothing to fetch)")
        tables["given"] = table(given)
        print(results_json.markdown(tables["given"]))
        print("\nseconds per question by agent:\n" + results_json.markdown(agent_seconds(given)))

    def summary(runs: dict[str, list[dict]]) -> dict:
        return {name: {"accuracy": round(mean([correct(r) for r in records]), 4),
                       "f1": round(mean([r["metrics"]["f1"] for r in records]), 4),
                       "seconds_per_question": round(mean([r["seconds"] for r in records]), 3)}
                for name, records in runs.items()}

    print(json.dumps({"fit": {"questions": len(first), "signal": signal, "answer_at": bar,
                              "auroc": fit_auroc},
                      "heldout_index": summary(held), "heldout_auroc": held_auroc,
                      "heldout_given": summary(given)}))
    if args.results_json:
        results_json.write(args.results_json, tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
