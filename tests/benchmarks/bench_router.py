"""Router benchmark: the `auto` pipeline against always-retrieve on a mixed question set.

Run directly (never collected by pytest):

    python tests/benchmarks/bench_router.py            # default, a few minutes on 2 cores
    python tests/benchmarks/bench_router.py --quick    # under a minute

Questions: HotpotQA distractor (--hotpotqa, default 20), PopQA long-tail (--popqa, default
20), both spread evenly over the shared files, and the nutrition questions of
tests/benchmarks/data/nutrition_questions.jsonl (--nutrition, default all 105): general
knowledge a model may know alone and facts only the textbook states. --quick takes 4 + 4 + 4.

Corpus: one index over the nutrition textbook's pages + the chosen HotpotQA questions'
passages (all 10 each, distractors included) + the chosen PopQA questions' two knowledge
texts, built with `ensure_index` in the user cache (reused while the corpus is unchanged).
Default: BM25 + dense, searched in `hybrid` mode; --quick: BM25 only (no embedding pass).

Measured in one process on the same questions, each pipeline through `run_evaluation` with
the embedded SmolLM2-135M-Instruct and k = 5 chunks, the retrieval cache emptied before each
so both retrieve cold:

* `auto` — the router (default `RouterConfig`) in front of `vanilla`;
* `always` — `vanilla`: every question retrieves;
* `never` — `direct`: no question retrieves (the floor; shows what skipping costs).

Reported: share of questions that skip retrieval, EM / accuracy / F1, generator input tokens
and seconds per question, overall and per source (--show-routes adds every question's
decision, features and who answered it right). Ends with one line of JSON. Torch runs on
--threads 1 by default: on cores shared with other jobs more threads run several times slower.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

from bench_data import DATA_DIR, NUTRITION_QUESTIONS

from sieverag.inference.composition.config import (
    ModelRoles,
    RetrievalConfig,
    RunConfig,
    TrustConfig,
)
from sieverag.inference.core.io_utils import cache_root, write_atomic
from sieverag.inference.core.types import Document, Example
from sieverag.inference.data import load_examples
from sieverag.inference.eval.runner import run_evaluation
from sieverag.inference.llm.backend_registry import BackendSpec
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL
from sieverag.inference.metrics.retrieval import spread_subset
from sieverag.inference.retrieval.config import IndexConfig
from sieverag.inference.retrieval.corpus import load_corpus
from sieverag.inference.retrieval.index_folder import CACHE_FILE, ensure_index

SOURCES = ("hotpotqa", "popqa", "nutrition")
# the name a row shows → the pipeline it runs
RUNS = {"auto": "auto", "always": "vanilla", "never": "direct"}


def pick_questions(data_dir: Path, hotpotqa: int, popqa: int,
                   nutrition: int | None) -> tuple[list[Example], list[Document]]:
    """The mixed question set (ids prefixed by source; `None`: every nutrition question)
    and the corpus it is asked over."""
    hotpot = spread_subset(load_examples(data_dir / "hotpotqa_distractor.jsonl", "hotpotqa"),
                           hotpotqa)
    pop = spread_subset(load_examples(data_dir / "popqa_longtail_with_passages.jsonl",
                                      "popqa"), popqa)
    own = spread_subset(load_examples(NUTRITION_QUESTIONS, "triviaqa"), nutrition)
    questions = [replace(e, id=f"{source}-{e.id}" if not e.id.startswith(source) else e.id)
                 for source, part in zip(SOURCES, (hotpot, pop, own), strict=True)
                 for e in part]
    corpus = {d.id: d for d in load_corpus(data_dir / "human_nutrition_2020_pages.jsonl")}
    for source, part in (("hotpotqa", hotpot), ("popqa", pop)):
        for example in part:
            for document in example.documents:
                corpus[f"{source}-{document.id}"] = document
    return questions, [replace(d, id=key) for key, d in corpus.items()]


def write_inputs(work: Path, questions: list[Example], corpus: list[Document]) -> tuple[Path, Path]:
    """The question file (`{id, question, answers}`) and corpus file (`{id, title, text}`)."""
    questions_file, corpus_file = work / "questions.jsonl", work / "corpus.jsonl"
    write_atomic(questions_file, "".join(
        json.dumps({"id": e.id, "question": e.question, "answers": list(e.answers)},
                   ensure_ascii=False) + "\n" for e in questions))
    write_atomic(corpus_file, "".join(
        json.dumps({"id": d.id, "title": d.title, "text": d.text}, ensure_ascii=False) + "\n"
        for d in corpus))
    return questions_file, corpus_file


def run_pipeline(pipeline: str, base: RunConfig, index_dir: Path, out: Path) -> list[dict]:
    """One pipeline over all questions, retrieval cache emptied first; its records."""
    (index_dir / CACHE_FILE).unlink(missing_ok=True)
    run_evaluation(replace(base, pipelines=(pipeline,)), out / pipeline)
    lines = (out / pipeline / "results" / f"{pipeline}.jsonl").read_text("utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def figures(records: list[dict]) -> dict[str, float]:
    """Means over records: metrics, retrieval share, generator tokens, seconds."""
    n = len(records)

    def mean(values: list[float]) -> float:
        return sum(values) / n if n else 0.0

    retrieved = [r["trace"]["route"]["retrieve"] if "route" in r.get("trace", {})
                 else bool(r["documents_read"]) for r in records]
    return {
        "n": n,
        "retrieve_rate": mean([float(x) for x in retrieved]),
        "em": mean([r["metrics"]["em"] for r in records]),
        "accuracy": mean([r["metrics"]["accuracy"] for r in records]),
        "f1": mean([r["metrics"]["f1"] for r in records]),
        "tokens": mean([r["generator_input_tokens"] for r in records]),
        "seconds": mean([r["seconds"] for r in records]),
    }


def saving(auto: float, always: float) -> float:
    """The share of always-retrieve's cost that `auto` does not spend."""
    return round(1 - auto / always, 4) if always else 0.0


def source_of(record: dict) -> str:
    return next(s for s in SOURCES if record["id"].startswith(f"{s}-"))


def counts_of(questions: list[Example]) -> list[int]:
    return [sum(source_of({"id": q.id}) == s for q in questions) for s in SOURCES]


def print_tables(results: dict[str, list[dict]]) -> None:
    header = (f"{'pipeline':<8} {'source':<10} {'n':>3} {'retrieves':>9} {'EM':>6} "
              f"{'acc':>6} {'F1':>6} {'gen tok/q':>10} {'s/q':>6}")
    print(header)
    print("-" * len(header))
    for name, records in results.items():
        for source in ("all", *SOURCES):
            part = records if source == "all" else [r for r in records
                                                    if source_of(r) == source]
            if not part:
                continue
            f = figures(part)
            print(f"{name:<8} {source:<10} {f['n']:>3} {f['retrieve_rate']:>9.2f} "
                  f"{f['em']:>6.3f} {f['accuracy']:>6.3f} {f['f1']:>6.3f} "
                  f"{f['tokens']:>10.1f} {f['seconds']:>6.2f}")
        print()


def print_routes(records: list[dict], always: list[dict], never: list[dict]) -> None:
    """One line per question: the decision, its features, and who answered correctly."""
    right_always = {r["id"]: r["metrics"]["accuracy"] for r in always}
    right_never = {r["id"]: r["metrics"]["accuracy"] for r in never}
    print("route     top   margin overlap tok  acc(always/never)  question  [reason]")
    for r in records:
        route = r["trace"]["route"]
        f = route["features"]
        print(f"{'RETRIEVE' if route['retrieve'] else 'skip':<8} "
              f"{f['top_score'] or 0:>6.2f} {f['score_margin'] or 0:>6.2f} "
              f"{f['vocabulary_overlap'] or 0:>6.2f} {f['query_tokens']:>4} "
              f"{right_always.get(r['id'], 0):>6.0f}/{right_never.get(r['id'], 0):<6.0f} "
              f"{r['question'][:70]}  [{route['reason']}]")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4+4+4 questions, BM25-only index")
    parser.add_argument("--hotpotqa", type=int, help="HotpotQA questions (default 20)")
    parser.add_argument("--popqa", type=int, help="PopQA questions (default 20)")
    parser.add_argument("--nutrition", type=int, help="nutrition questions (default all)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="generator model")
    parser.add_argument("-k", type=int, default=5, help="chunks retrieved per question")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--work-dir", type=Path, help="corpus and index folder "
                        "(default: the user cache)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: on cores shared with other jobs "
                             "more threads run several times slower; 0 = torch's choice)")
    parser.add_argument("--show-routes", action="store_true",
                        help="print every question's decision and features")
    args = parser.parse_args()
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    size = 4 if args.quick else None
    counts = (args.hotpotqa or size or 20, args.popqa or size or 20, args.nutrition or size)
    variant = "quick" if args.quick else "default"
    work = args.work_dir or cache_root() / "bench-router"
    work = work / variant

    questions, corpus = pick_questions(args.data_dir, *counts)
    questions_file, corpus_file = write_inputs(work, questions, corpus)
    index_config = IndexConfig(dense=None) if args.quick else IndexConfig()
    mode = "bm25" if args.quick else "hybrid"
    index = ensure_index(corpus_file, work / "index", index_config)
    per_source = ", ".join(f"{n} {s}" for s, n in zip(SOURCES, counts_of(questions),
                                                      strict=True))
    print(f"{len(questions)} questions ({per_source}); corpus {len(corpus)} documents, "
          f"{index.size} chunks; mode {mode}, k={args.k}\n", flush=True)

    base = RunConfig(dataset=str(questions_file), dataset_format="triviaqa",
                     models=ModelRoles(generator=BackendSpec(model=args.model)),
                     retrieval=RetrievalConfig(index=str(work / "index"), mode=mode, k=args.k),
                     trust=TrustConfig(enabled=False))
    with tempfile.TemporaryDirectory(prefix="bench-router-") as tmp:
        results = {name: run_pipeline(pipeline, base, work / "index", Path(tmp))
                   for name, pipeline in RUNS.items()}
    print()
    if args.show_routes:
        print_routes(results["auto"], results["always"], results["never"])
    print_tables(results)

    auto, always, never = (figures(results[name]) for name in RUNS)
    by_source = {s: figures([r for r in results["auto"] if source_of(r) == s]) for s in SOURCES}
    print(json.dumps({
        "questions": auto["n"],
        "skip_rate": round(1 - auto["retrieve_rate"], 4),
        **{f"skip_rate_{s}": round(1 - f["retrieve_rate"], 4) for s, f in by_source.items()
           if f["n"]},
        **{f"{name}_{metric}": round(f[metric], 4) for name, f in
           (("auto", auto), ("always", always), ("never", never))
           for metric in ("em", "accuracy", "f1")},
        "auto_gen_tokens_per_q": round(auto["tokens"], 1),
        "always_gen_tokens_per_q": round(always["tokens"], 1),
        "token_saving": saving(auto["tokens"], always["tokens"]),
        "auto_s_per_q": round(auto["seconds"], 3),
        "always_s_per_q": round(always["seconds"], 3),
        "time_saving": saving(auto["seconds"], always["seconds"]),
        "mode": mode,
        "k": args.k,
    }))


if __name__ == "__main__":
    main()
