"""Amber on open retrieval at an equal reading budget: vanilla top-K, iter-retgen, amber and
its ablations, side by side on the same questions over one index.

Every pipeline runs through `sieverag eval` with the `amber-open` preset (K = 6: vanilla top 6;
amber 3 per round for 2 rounds; iter-retgen 3 + 3) on one index of several corpora (built
here when `--index` does not hold it yet). Per round it reports the share of questions whose
gold passages have all been retrieved so far (gold-pair recall on HotpotQA) and, for amber,
all been kept by the filter; then accuracy, F1, EM, generator input tokens, LLM calls and
seconds per question. Index chunks are matched to each question's given passages
(`inference.data.gold_match`).

    python tests/benchmarks/bench_open_retrieval.py --dataset hotpotqa_distractor.jsonl \\
        --corpus hotpotqa_distractor.jsonl,squad_dev_v1.1.json.zip,nutrition_pages.jsonl \\
        --index runs/open-index --question-ids runs/dataset-hotpot/validation_ids.txt \\
        [--limit 100] [--out runs/bench-open] [--set amber.collector.query_source=bridge]

A rerun with the same settings into the same `--out` only adds what is new (other settings
need another `--out`). An index already in `--index` is used as it is, whatever it was built
from. `--quick`: 3 questions. Prints the tables and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from offline_env import run_offline

run_offline()

from sieverag.inference.cli.run import EvalCommand  # noqa: E402
from sieverag.inference.composition.compose import plan_run  # noqa: E402
from sieverag.inference.composition.config import RunConfig  # noqa: E402
from sieverag.inference.core.settings import narrow, parse_settings  # noqa: E402
from sieverag.inference.core.types import Example  # noqa: E402
from sieverag.inference.data.gold_match import read_passage_ids  # noqa: E402
from sieverag.inference.eval import runner  # noqa: E402
from sieverag.inference.eval.report import usage_table  # noqa: E402
from sieverag.inference.retrieval.config import IndexConfig  # noqa: E402
from sieverag.inference.retrieval.index_folder import Index, build_index  # noqa: E402
from sieverag.inference.retrieval.manifest import MANIFEST_FILE  # noqa: E402


def rounds_of(pipeline: str, record: dict) -> list[tuple[list[str], list[str]]]:
    """(retrieved ids, kept ids) per round of one record."""
    trace = record.get("trace") or {}
    if "rounds" in trace:  # amber
        return [(r["retrieved"], r["kept"]) for r in trace["rounds"]]
    if "iterations" in trace:  # iter-retgen reads all it retrieves
        return [(i["retrieved"], i["retrieved"]) for i in trace["iterations"]]
    return [(record["documents_read"], record["documents_read"])]


def gold_covered(example: Example, ids: list[str], chunks: dict) -> bool:
    """Whether the chunks `ids` cover every gold passage of `example` (matched to the given
    passages as over-index runs match what they read)."""
    gold = {d.id for d in example.documents if d.is_gold}
    read = read_passage_ids(example, [chunks[i] for i in ids if i in chunks])
    return bool(gold) and gold <= set(read)


def per_round(pipeline: str, records: list[dict], examples: dict[str, Example],
              chunks: dict, rounds: int) -> dict[str, list[float | None]]:
    """Per round r: the share of questions with all gold retrieved, and kept, by round r."""
    retrieved, kept = [[] for _ in range(rounds)], [[] for _ in range(rounds)]
    for record in records:
        example = examples[record["id"]]
        if not any(d.is_gold for d in example.documents):
            continue
        so_far_retrieved: list[str] = []
        so_far_kept: list[str] = []
        steps = rounds_of(pipeline, record)
        for number in range(rounds):
            if number < len(steps):  # a loop that stopped early adds nothing later
                so_far_retrieved += steps[number][0]
                so_far_kept += steps[number][1]
            retrieved[number].append(gold_covered(example, so_far_retrieved, chunks))
            kept[number].append(gold_covered(example, so_far_kept, chunks))
    share = [round(sum(v) / len(v), 3) if v else None for v in retrieved]
    share_kept = [round(sum(v) / len(v), 3) if v else None for v in kept]
    return {"gold_retrieved": share, "gold_kept": share_kept}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--corpus", required=True, help="corpus file(s), comma-separated")
    parser.add_argument("--index", default="runs/open-index")
    parser.add_argument("--question-ids", default=None)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--pipelines", default=None, help="default: the preset's")
    parser.add_argument("--set", action="append", default=[],
                        help="SECTION.FIELD=VALUE: any `sieverag eval` setting")
    parser.add_argument("--out", default="runs/bench-open")
    parser.add_argument("--quick", action="store_true", help="3 questions")
    args = parser.parse_args(argv)
    limit = 3 if args.quick else args.limit

    if not (Path(args.index) / MANIFEST_FILE).is_file():  # never rebuild an existing index
        build_index(args.corpus.split(","), args.index, IndexConfig())
    flags = ["--preset", "amber-open", "--dataset", args.dataset, "--retrieval.index",
             args.index, "--limit", str(limit), "--no-trust.enabled"]
    if args.question_ids:
        flags += ["--question-ids", args.question_ids]
    if args.pipelines:
        flags += ["--pipelines", args.pipelines]
    for setting in args.set:
        name, _, value = setting.partition("=")
        flags += [f"--{name.replace('_', '-')}", value]
    config = narrow(parse_settings(EvalCommand, flags, "bench_open_retrieval"), RunConfig)
    summaries = runner.run_evaluation(config, args.out, progress=True)

    examples = {e.id: e for e in runner.selected_examples(plan_run(config))}
    chunks = {c.id: c.to_document() for c in Index.load(args.index).chunks}
    rounds = max(config.amber.max_iterations, config.iter_retgen.iterations)
    table = {}
    for name in config.pipelines:
        path = Path(args.out) / "results" / f"{name}.jsonl"
        records = [json.loads(line) for line in path.open(encoding="utf-8")]
        table[name] = {**per_round(name, records, examples, chunks, rounds),
                       **{k: summaries[name].get(k) for k in (
                           "accuracy", "f1", "em", "generator_input_tokens_per_question",
                           "llm_calls_per_question", "seconds_per_question")}}
    print(f"\n{len(examples)} questions of {args.dataset} over {args.index}")
    heads = [f"all gold retrieved r{r + 1}" for r in range(rounds)]
    heads += [f"all gold kept r{r + 1}" for r in range(rounds)]
    heads += ["Acc", "F1", "EM", "gen. in-tok/q", "LLM calls/q", "s/q"]
    print("| pipeline | " + " | ".join(heads) + " |")
    print("|---|" + "---:|" * len(heads))
    for name, row in table.items():
        cells = [*row["gold_retrieved"], *row["gold_kept"]]
        cells += [row[k] for k in ("accuracy", "f1", "em", "generator_input_tokens_per_question",
                                   "llm_calls_per_question", "seconds_per_question")]
        print(f"| {name} | " + " | ".join("–" if c is None else f"{c:.3f}" if isinstance(
            c, float) else str(c) for c in cells) + " |")
    for name in config.pipelines:  # where the seconds go
        print(f"\n{name}, per question:\n" + "\n".join(usage_table(summaries[name])))
    print(json.dumps({"questions": len(examples), "pipelines": table}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
