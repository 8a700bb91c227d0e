"""Auto-RAG study benchmark: LLM-only, always-RAG and auto (both router rules) with the trust
metrics on the nutrition question set, and the retrieval-mode × evidence-filtering ablation.

Run directly (never collected by pytest):

    python tests/benchmarks/bench_auto_rag.py                 # the study's tables, ~80 min
    python tests/benchmarks/bench_auto_rag.py --quick         # 9 questions, BM25 only

Questions: tests/benchmarks/data/nutrition_questions.jsonl (105: factual, conceptual and
textbook-specific, each with a reference answer and keywords; see that folder's README).
The 28 ids of nutrition_tuning_ids.txt (the set's first version) are the TUNING questions:
the knowledge rule's similarity threshold is chosen on them; every other question is
HELD OUT, and the tables say which figures are which.
Corpus: the textbook's pages (human_nutrition_2020_pages.jsonl in --data-dir), indexed once
with the default chunking, BM25 + dense, under --out.

Runs (each a resumable `sieverag eval` run folder under --out, so an interrupted benchmark
continues where it stopped; the embedded SmolLM2-135M-Instruct generates, k chunks read):
1. `main`: `direct` (LLM-only), `vanilla` (always-RAG) and `auto` under the router's default
   `knowledge` rule, hybrid retrieval.
2. the threshold: for each `router.min_knowledge_similarity` on a grid, auto's TAAS on the
   tuning questions as the router would route them (its recorded features; a routed question
   reads what `vanilla` read, a skipped one answers as `direct` did); the best is run as
   `auto-tuned` when it differs from the default.
3. `auto-corpus-match`: `auto` under the old corpus-match rule.
4. the ablation (`ablation-MODE-FILTER`): `vanilla` over dense / bm25 / hybrid retrieval ×
   evidence filtering off / loose / strict (`retrieval.hygiene`), on --ablation-questions
   questions spread over the three kinds.

Prints the tables (overall, tuning, held-out, per kind; Δ(auto − LLM-only) per question) and
ends with one line of JSON holding the figures.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from bench_data import DATA_DIR, NUTRITION_QUESTIONS, ROOT

from sieverag.inference.composition.config import (
    ModelRoles,
    RetrievalConfig,
    RunConfig,
    TrustConfig,
)
from sieverag.inference.core.io_utils import JsonlLog, write_atomic
from sieverag.inference.data import load_examples
from sieverag.inference.eval.report import delta_table
from sieverag.inference.eval.result_records import EvalRecord
from sieverag.inference.eval.runner import run_evaluation
from sieverag.inference.eval.summary import summarize
from sieverag.inference.llm.backend_registry import BackendSpec
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL
from sieverag.inference.metrics.retrieval import spread_subset
from sieverag.inference.pipelines.auto.retrieval_router import RouterConfig
from sieverag.inference.retrieval.config import IndexConfig
from sieverag.inference.retrieval.index_folder import ensure_index

TUNING_IDS = ROOT / "tests" / "benchmarks" / "data" / "nutrition_tuning_ids.txt"
PAGES = "human_nutrition_2020_pages.jsonl"
KINDS = ("factual", "conceptual", "textbook-specific")
THRESHOLDS = tuple(round(0.2 + 0.05 * i, 2) for i in range(15))  # 0.20 … 0.90
COLUMNS = (("retrieval_usage_rate", "retr."), ("accuracy", "Acc"), ("answer_quality", "AQS"),
           ("taas", "TAAS"), ("faithfulness", "Faith."), ("hallucination_rate", "Halluc.↓"),
           ("context_precision", "CtxP"), ("evidence_noise", "Noise↓"),
           ("sentence_support_rate", "SSR"), ("sentence_taas", "sTAAS(ours)"),
           ("sentence_context_precision", "sCtxP(ours)"), ("seconds_per_question", "s/q"))


def read_records(run: Path, pipeline: str) -> list[EvalRecord]:
    return JsonlLog(run / "results" / f"{pipeline}.jsonl").read_records(EvalRecord)


def cell(value: object) -> str:
    return f"{value:>8.3f}" if isinstance(value, float) else f"{'–' if value is None else value:>8}"


def row(name: str, records: list[EvalRecord]) -> str:
    summary = summarize(records) if records else {}
    return f"{name:<24} {len(records):>4} " + " ".join(cell(summary.get(key))
                                                       for key, _ in COLUMNS)


def header(title: str) -> str:
    return (f"\n{title}\n{'pipeline':<24} {'n':>4} "
            + " ".join(f"{t:>8}" for _, t in COLUMNS))


def figures(records: list[EvalRecord]) -> dict:
    summary = summarize(records)
    return {key: summary.get(key) for key, _ in COLUMNS} | {"n": len(records)}


def simulated_taas(auto: list[EvalRecord], direct: dict[str, EvalRecord],
                   vanilla: dict[str, EvalRecord], threshold: float, min_complexity: int
                   ) -> tuple[float, float]:
    """(mean TAAS, retrieval usage) of `auto` as the knowledge rule would route at
    `threshold`: from each question's recorded similarity and complexity."""
    taas, retrieved = [], []
    for record in auto:
        features = record.trace.route.features  # auto's RouteTrace
        goes = (features["knowledge_similarity"] < threshold
                or (min_complexity > 0 and features["complexity"] >= min_complexity))
        source = vanilla if goes else direct
        taas.append(source[record.id].trust.taas or 0.0)
        retrieved.append(float(goes))
    return sum(taas) / len(taas), sum(retrieved) / len(retrieved)


def write_ids(path: Path, ids: list[str]) -> Path:
    write_atomic(path, "".join(f"{i}\n" for i in ids))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="9 questions (3 per kind), BM25 only, ablation of bm25 only")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-auto-rag")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="generator model")
    parser.add_argument("-k", type=int, default=5, help="chunks retrieved per question")
    parser.add_argument("--ablation-questions", type=int, default=30,
                        help="questions of the ablation runs, spread over the kinds")
    parser.add_argument("--llm-grader", action="store_true",
                        help="also grade every answer with the LLM grader (the generator)")
    args = parser.parse_args()

    out = args.out / ("quick" if args.quick else "default")
    examples = load_examples(NUTRITION_QUESTIONS)
    tuning = set(TUNING_IDS.read_text(encoding="utf-8").split())
    by_kind = {kind: [e.id for e in examples if e.metadata.get("kind") == kind]
               for kind in KINDS}
    ids = ([i for kind in KINDS for i in spread_subset(by_kind[kind], 3)] if args.quick
           else [e.id for e in examples])
    main_ids = write_ids(out / "question_ids.txt", ids)
    per_kind = max(1, args.ablation_questions // len(KINDS))
    ablation_ids = write_ids(out / "ablation_ids.txt", [
        i for kind in KINDS for i in spread_subset([x for x in by_kind[kind] if x in ids],
                                                   per_kind)])
    index_dir = out / "index"
    index = ensure_index(args.data_dir / PAGES, index_dir,
                         IndexConfig(dense=None) if args.quick else IndexConfig())
    mode = "bm25" if args.quick else "hybrid"
    print(f"{len(ids)} questions ({len(tuning & set(ids))} tuning); textbook index of "
          f"{index.size} chunks; {mode}, k={args.k}", flush=True)

    base = RunConfig(
        dataset=str(NUTRITION_QUESTIONS), question_ids=str(main_ids),
        models=ModelRoles(generator=BackendSpec(model=args.model)),
        retrieval=RetrievalConfig(index=str(index_dir), mode=mode, k=args.k),
        trust=TrustConfig(llm_grader=args.llm_grader))
    default_rule = RouterConfig()
    runs: dict[str, list[EvalRecord]] = {}

    def run(folder: str, config: RunConfig, label: str | None = None) -> None:
        print(f"\n== {folder}", flush=True)
        run_evaluation(config, out / folder)
        for pipeline in config.pipelines:
            runs[label or (pipeline if folder == "main" else folder)] = read_records(
                out / folder, pipeline)

    run("main", replace(base, pipelines=("direct", "vanilla", "auto")))
    direct = {r.id: r for r in runs["direct"]}
    vanilla = {r.id: r for r in runs["vanilla"]}
    tuning_auto = [r for r in runs["auto"] if r.id in tuning]
    print("\nknowledge threshold on the TUNING questions (simulated from recorded features):")
    print(f"{'threshold':>9} {'TAAS':>7} {'retrieval':>9}")
    grid = {}
    for threshold in THRESHOLDS:
        grid[threshold] = simulated_taas(tuning_auto, direct, vanilla, threshold,
                                         default_rule.min_complexity)
        print(f"{threshold:>9.2f} {grid[threshold][0]:>7.4f} {grid[threshold][1]:>9.3f}")
    # the best TAAS; among ties the one retrieving least (retrieval costs)
    chosen = max(THRESHOLDS, key=lambda t: (round(grid[t][0], 6), -grid[t][1]))
    print(f"chosen: {chosen} (default {default_rule.min_knowledge_similarity})")
    if chosen != default_rule.min_knowledge_similarity:
        run("auto-tuned", replace(base, pipelines=("auto",), router=replace(
            default_rule, min_knowledge_similarity=chosen)), label="auto-tuned")
    run("auto-corpus-match", replace(base, pipelines=("auto",),
                                     router=RouterConfig(rule="corpus-match")),
        label="auto-corpus-match")

    modes = ("bm25",) if args.quick else ("dense", "bm25", "hybrid")
    ablation: dict[str, list[EvalRecord]] = {}
    for retrieval_mode in modes:
        for hygiene in ("off", "loose", "strict"):
            folder = f"ablation-{retrieval_mode}-{hygiene}"
            config = replace(base, pipelines=("vanilla",), question_ids=str(ablation_ids),
                             trust=TrustConfig(),
                             retrieval=replace(base.retrieval, mode=retrieval_mode,
                                               hygiene=hygiene))
            print(f"\n== {folder}", flush=True)
            run_evaluation(config, out / folder)
            ablation[folder] = read_records(out / folder, "vanilla")

    names = {"direct": "LLM-only (direct)", "vanilla": "always-RAG (vanilla)",
             "auto": "auto, knowledge rule", "auto-tuned": f"auto, knowledge τ={chosen}",
             "auto-corpus-match": "auto, corpus-match"}
    for title, keep in (("ALL questions", lambda r: True),
                        ("TUNING questions", lambda r: r.id in tuning),
                        ("HELD-OUT questions", lambda r: r.id not in tuning)):
        print(header(title))
        for name, records in runs.items():
            print(row(names[name], [r for r in records if keep(r)]))
    for kind in KINDS:
        print(header(f"HELD-OUT, {kind}"))
        for name, records in runs.items():
            print(row(names[name], [r for r in records
                                    if r.id not in tuning and r.kind == kind]))
    for name in [n for n in runs if n.startswith("auto")]:
        print("\n" + "\n".join(delta_table({name: runs[name], "direct": runs["direct"]}, name,
                                             "direct")))
    print(header(f"ABLATION: vanilla, {len(ablation[next(iter(ablation))])} questions, "
                 "retrieval mode × evidence filtering"))
    for folder, records in ablation.items():
        removed = sum(len(r.hygiene_removed or []) for r in records) / len(records)
        print(row(folder.removeprefix("ablation-"), records) + f"  removed/q {removed:.2f}")

    held_out = {name: figures([r for r in records if r.id not in tuning])
                for name, records in runs.items()}
    print(json.dumps({
        "questions": len(ids), "tuning": len(tuning & set(ids)), "k": args.k, "mode": mode,
        "chosen_knowledge_threshold": chosen,
        "all": {name: figures(records) for name, records in runs.items()},
        "held_out": held_out,
        "ablation": {folder.removeprefix("ablation-"): figures(records)
                     for folder, records in ablation.items()},
    }))


if __name__ == "__main__":
    main()
