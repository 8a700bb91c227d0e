"""The standard benchmarks as a user exports them from the hub: direct, vanilla and main-rag
on the first N questions of HotpotQA, NQ-open, TriviaQA, PopQA and ARC-Challenge.

Each dataset's rows (the project's copies in `--data`, by default ../shared/data) are written
in the hub's own schema by the test helper `tests/standard_exports.py` — `hotpot_qa`,
`nq_open`, `trivia_qa`, `akariasai/PopQA`, `ai2_arc` — and read back through the adapters a
user's export goes through. Every pipeline retrieves its documents (top `--k`, BM25) from an
index of the dataset's own passages where it has them (HotpotQA's contexts, NQ's gold
passages, PopQA's retrieved knowledge texts); TriviaQA and ARC carry none, so they search
the other three datasets' passages together. Then MAIN-RAG's ordering ablation on PopQA:
the kept documents read in descending (the paper's), ascending and random judge order —
from the main-rag run's stored judge scores (`judge-sweep --order`), no second judge pass.

    python tests/benchmarks/bench_standard_benchmarks.py [--data ../shared/data] [--limit 100]
        [--k 5] [--datasets hotpotqa,popqa] [--out runs/bench-standard] [--no-order-ablation]

A rerun into the same --out resumes each run. Prints the papers' tables (`sieverag report`)
and one JSON line; `--results-json PATH` also writes docs/results/pipelines.md's two tables
(docs/results/data/standard_benchmarks.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from offline_env import run_offline

run_offline()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: standard_exports

import results_json  # noqa: E402
from standard_exports import EXPORTS, read_jsonl, write_jsonl  # noqa: E402

from sieverag.inference.cli.run import EvalCommand  # noqa: E402
from sieverag.inference.composition.config import RunConfig  # noqa: E402
from sieverag.inference.core.settings import narrow, parse_settings  # noqa: E402
from sieverag.inference.eval import runner  # noqa: E402
from sieverag.inference.eval.judge_sweep import bar_label, sweep_judge_bar  # noqa: E402
from sieverag.inference.eval.report import collate_runs  # noqa: E402
from sieverag.inference.retrieval.config import IndexConfig  # noqa: E402
from sieverag.inference.retrieval.index_folder import build_index  # noqa: E402
from sieverag.inference.retrieval.manifest import MANIFEST_FILE  # noqa: E402

SOURCES = {"hotpotqa": "hotpotqa_distractor.jsonl", "nq-open": "nq-open-oracle.jsonl.gz",
           "triviaqa": "triviaqa_test_ctrla.jsonl", "popqa": "popqa_longtail_with_passages.jsonl",
           "arc-challenge": "arc_challenge_test.jsonl"}
ORDERS = ("ascending", "random")  # beside main-rag's own descending order


def _index(corpus: list[dict], folder: Path) -> Path:
    """A BM25 index of `corpus` (`{id, title, text}` rows) in `folder`, built once."""
    if not (folder / MANIFEST_FILE).is_file():
        corpus_file = write_jsonl(folder.with_name(folder.name + "-corpus.jsonl"), corpus)
        build_index([str(corpus_file)], folder, IndexConfig(dense=None))
    return folder


def _run(dataset: Path, index: Path, out: Path, args: argparse.Namespace,
         pipelines: str) -> dict:
    flags = ["--dataset", str(dataset), "--pipelines", pipelines, "--retrieval.index",
             str(index), "--retrieval.mode", "bm25", "--retrieval.k", str(args.k),
             "--limit", str(args.limit), "--no-trust.enabled"]
    config = narrow(parse_settings(EvalCommand, flags, "bench_standard_benchmarks"), RunConfig)
    print(f"{out.name}: {pipelines} ...", file=sys.stderr, flush=True)
    return runner.run_evaluation(config, out, progress=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--k", type=int, default=5, help="documents retrieved per question")
    parser.add_argument("--datasets", default=",".join(SOURCES))
    parser.add_argument("--pipelines", default="direct,vanilla,main-rag")
    parser.add_argument("--out", default="runs/bench-standard")
    parser.add_argument("--no-order-ablation", action="store_true")
    results_json.add_option(parser)
    args = parser.parse_args()
    chosen = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if not set(chosen) <= set(SOURCES):
        parser.error(f"--datasets: unknown {sorted(set(chosen) - set(SOURCES))}; "
                     f"known: {', '.join(SOURCES)}")
    out = Path(args.out)

    exported: dict[str, tuple[Path, list[dict]]] = {}
    for name in SOURCES:  # every export: the datasets without passages search the others'
        rows = read_jsonl(Path(args.data) / SOURCES[name], args.limit)
        questions, passages = EXPORTS[name](rows)
        exported[name] = (write_jsonl(out / "exports" / f"{name}.jsonl", questions), passages)
    shared = [p for name in SOURCES for p in exported[name][1]]

    run_dirs, figures = [], {}
    for name in chosen:
        dataset, passages = exported[name]
        index = (_index(passages, out / "indexes" / name) if passages
                 else _index(shared, out / "indexes" / "shared"))
        run_dir = out / "runs" / name
        summaries = _run(dataset, index, run_dir, args, args.pipelines)
        run_dirs.append(run_dir)
        figures[name] = {p: {k: s.get(k) for k in ("examples", "em", "f1", "accuracy",
                                                     "choice_accuracy",
                                                     "generator_input_tokens_per_question",
                                                     "input_tokens_per_question",
                                                     "seconds_per_question")}
                         for p, s in summaries.items()}
        if name == "popqa" and "main-rag" in summaries and not args.no_order_ablation:
            figures["popqa main-rag order"] = {"descending": summaries["main-rag"]}
            for order in ORDERS:
                # at the run's own bar (the default n = 0): its kept sets, another order
                sweep = sweep_judge_bar(run_dir, [0.0], out=out / "order" / order, order=order)
                figures["popqa main-rag order"][order] = sweep["bars"][bar_label(0.0)]

    print(f"\nfirst {args.limit} questions, BM25 top {args.k}, the embedded model\n")
    print(collate_runs(run_dirs))
    if "popqa main-rag order" in figures:
        print("\nMAIN-RAG's reading order on PopQA (the same judge scores, n = 0)\n")
        print("| order | accuracy | F1 | EM |\n|---|---:|---:|---:|")
        for order, summary in figures["popqa main-rag order"].items():
            print(f"| {order} | {summary['accuracy']:.3f} | {summary['f1']:.3f} | "
                  f"{summary['em']:.3f} |")
        figures["popqa main-rag order"] = {
            order: {k: summary.get(k) for k in ("examples", "em", "f1", "accuracy")}
            for order, summary in figures["popqa main-rag order"].items()}
    print(json.dumps({"limit": args.limit, "k": args.k, "figures": figures}))
    if args.results_json:
        results_json.write(args.results_json, results_tables(figures, chosen))


def results_tables(figures: dict, datasets: list[str]) -> dict:
    """docs/results/pipelines.md's tables: per pipeline and dataset, the accuracy (with the
    choice accuracy where the dataset has choices), then F1 / generator tokens / seconds a
    question."""
    pipelines = list(dict.fromkeys(p for d in datasets for p in figures[d]))

    def accuracy(s: dict | None) -> str | None:
        if s is None:
            return None
        choice = s.get("choice_accuracy")
        return f"{s['accuracy']:.3f}" + (f" ({choice:.3f})" if choice is not None else "")

    def cost(s: dict | None) -> str | None:
        return None if s is None else (f"{s['f1']:.3f} / "
                                       f"{s['generator_input_tokens_per_question']:,.0f} / "
                                       f"{s['seconds_per_question']:.1f}")

    def rows(cell) -> list[list]:
        return [[p, *[cell(figures[d].get(p)) for d in datasets]] for p in pipelines]

    align = ["", *["right"] * len(datasets)]
    return {"accuracy": results_json.table(["accuracy (contains a gold answer)", *datasets],
                                           rows(accuracy), align=align),
            "f1_tokens_seconds": results_json.table(
                ["F1 / generator tokens per question / s per question", *datasets],
                rows(cost), align=align)}


if __name__ == "__main__":
    main()
