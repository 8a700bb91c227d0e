"""Retrieval benchmark: BM25 speed, SQuAD recall@5 per mode, dense indexing throughput/memory.

Run directly (never collected by pytest):

    python tests/benchmarks/bench_retrieval.py            # default, a few minutes on 2 cores
    python tests/benchmarks/bench_retrieval.py --quick    # under a minute

(a) BM25 queries/s: sieverag's `BM25Index` (a bm25s index, bm25s scoring, its own top-k)
    against rank_bm25's BM25Okapi on the same corpus of ≥ 50k small chunks (SQuAD paragraphs
    + HotpotQA passages + nutrition pages, cut into 20-word windows, replicated if short of
    50k) and the same SQuAD questions (200; 50 with --quick), tokenised once by the index's
    own tokenizer for all. bm25s's own `retrieve` is timed too, for reference. The index uses
    the `robertson` variant, BM25Okapi's formula, so the mean top-10 overlap shows it is the
    same ranking function. Only scoring + top-k is timed.
(b) Recall@5 on SQuAD v1.1 dev for bm25, dense, hybrid, rrf: all 2,067 paragraphs (one
    chunk each) and a fixed evenly spread subset of questions (--squad-questions, default
    2,000 of 10,570; encoding all of them takes minutes on 2 shared cores). --quick uses the
    first 2 articles' paragraphs and 150 of their questions. The index is the one
    `sieverag eval-retrieval --corpus squad` keeps in the user cache folder, reused when present.
(c) Dense indexing: chunks/s and resident memory after each shard while streaming
    --dense-chunks 20-word chunks (default 20,000 in shards of 2,000, 10× the SQuAD paragraph
    count; --quick 400 in shards of 100) through all-MiniLM-L6-v2, in a fresh process so the
    figures are its own. Memory is flat when resident and peak MB stop growing after the
    first shard: the peak is set by one encoder batch, not by the corpus.

Prints readable tables and ends with one line of JSON holding the figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_data import DATA_DIR  # noqa: E402

from sieverag.inference.cli.index import (  # noqa: E402
    default_eval_index_dir,
)
from sieverag.inference.core.io_utils import cache_root  # noqa: E402
from sieverag.inference.metrics.retrieval import evaluate_retrieval, format_table, spread_subset  # noqa: E402
from sieverag.inference.retrieval.bm25 import BM25Config, BM25Index  # noqa: E402
from sieverag.inference.retrieval.chunking import ChunkingConfig, chunk_corpus  # noqa: E402
from sieverag.inference.retrieval.config import IndexConfig  # noqa: E402
from sieverag.inference.retrieval.corpus import load_corpus, load_squad  # noqa: E402
from sieverag.inference.retrieval.index_folder import ensure_index  # noqa: E402

MIN_BM25_CHUNKS = 50_000
QUICK_ARTICLES = 2
SMALL_CHUNKS = ChunkingConfig("tokens", size=20, overlap=4)


def small_chunk_texts(data_dir: Path, minimum: int) -> list[str]:
    """SQuAD + HotpotQA + nutrition chunked small, replicated until `minimum` chunks."""
    documents = [*load_squad(data_dir / "squad_dev_v1.1.json.zip")[0],
                 *load_corpus(data_dir / "hotpotqa_distractor.jsonl"),
                 *load_corpus(data_dir / "human_nutrition_2020_pages.jsonl")]
    texts = [chunk.to_document().as_context() for chunk in chunk_corpus(documents, SMALL_CHUNKS)]
    copies = -(-minimum // len(texts))
    return texts * copies


def bench_bm25(data_dir: Path, queries: list[str]) -> dict[str, float]:
    """(a) sieverag's bm25s index vs rank_bm25 on identical tokens."""
    from rank_bm25 import BM25Okapi

    texts = small_chunk_texts(data_dir, MIN_BM25_CHUNKS)
    start = time.perf_counter()
    index = BM25Index.build(texts, BM25Config(method="robertson"), show_progress=False)
    bm25s_build = time.perf_counter() - start
    # The index's own tokenizer, vocabulary frozen: the tokens rank_bm25 gets are the same.
    tokenizer = index.tokenizer
    corpus_tokens = tokenizer.decode(tokenizer.tokenize(texts, update_vocab=False,
                                                        return_as="ids", show_progress=False))
    query_ids = [ids for ids in index.tokenize_queries(queries) if ids]
    query_tokens = tokenizer.decode(query_ids)
    start = time.perf_counter()
    okapi = BM25Okapi(corpus_tokens, k1=1.5, b=0.75)
    okapi_build = time.perf_counter() - start

    seconds: dict[str, list[float]] = {"sieverag": [], "bm25s": [], "rank_bm25": []}
    ours: list[list[tuple[int, float]]] = []
    okapi_top: list[np.ndarray] = []
    # Alternate the three, one round per repetition, so machine noise hits all alike.
    for _ in range(2):
        start = time.perf_counter()
        ours = index.search_tokens(query_ids, 10)
        seconds["sieverag"].append(time.perf_counter() - start)
        start = time.perf_counter()
        index.retriever.retrieve(query_ids, k=10, show_progress=False)
        seconds["bm25s"].append(time.perf_counter() - start)
        start = time.perf_counter()
        okapi_top = [np.argsort(-okapi.get_scores(q), kind="stable")[:10] for q in query_tokens]
        seconds["rank_bm25"].append(time.perf_counter() - start)
    overlap = np.mean([len({p for p, _ in a} & set(b.tolist())) / 10
                       for a, b in zip(ours, okapi_top, strict=True)])
    qps = {name: len(query_ids) / min(times) for name, times in seconds.items()}
    ratio = qps["sieverag"] / qps["rank_bm25"]
    print(f"\n(a) BM25: {len(texts):,} chunks, {len(query_ids)} SQuAD questions "
          "(identical tokens for all rows)")
    print(f"  {'implementation':<34} {'build s':>8} {'queries/s':>10}")
    print(f"  {'sieverag BM25Index (bm25s index)':<34} {bm25s_build:>8.1f} "
          f"{qps['sieverag']:>10.1f}")
    print(f"  {'bm25s BM25.retrieve as shipped':<34} {'':>8} {qps['bm25s']:>10.1f}")
    print(f"  {'rank_bm25 BM25Okapi':<34} {okapi_build:>8.1f} {qps['rank_bm25']:>10.1f}")
    print(f"  ratio {ratio:.1f}x, mean top-10 overlap with rank_bm25 {overlap:.3f}")
    return {"bm25_corpus_chunks": len(texts), "bm25_queries": len(query_ids),
            "bm25_sieverag_qps": round(qps["sieverag"], 1),
            "bm25s_retrieve_qps": round(qps["bm25s"], 1),
            "rank_bm25_qps": round(qps["rank_bm25"], 2), "bm25_ratio": round(ratio, 1),
            "bm25_top10_overlap": round(float(overlap), 3)}


def quick_squad_file(data_dir: Path, articles: int, out: Path) -> Path:
    """A SQuAD file holding only the first `articles` articles (rewritten only if it differs,
    so the quick index is reused from one run to the next)."""
    import zipfile

    with zipfile.ZipFile(data_dir / "squad_dev_v1.1.json.zip") as archive:
        payload = json.load(archive.open(archive.namelist()[0]))
    payload["data"] = payload["data"][:articles]
    text = json.dumps(payload)
    if not out.is_file() or out.read_text(encoding="utf-8") != text:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    return out


def bench_recall(squad_path: Path, questions: int) -> dict[str, float]:
    """(b) recall@5 per mode on SQuAD dev paragraphs."""
    # The settings (and so the cached index) of `sieverag eval-retrieval --corpus squad`.
    config = IndexConfig(chunking=ChunkingConfig("none"), corpus_format="squad")
    work_dir = default_eval_index_dir("squad", config, squad_path)
    start = time.perf_counter()
    index = ensure_index(squad_path, work_dir, config, use_cache=False)
    prepared = time.perf_counter() - start
    examples = spread_subset(load_squad(squad_path)[1], questions)
    scores = evaluate_retrieval(index, examples, ["bm25", "dense", "hybrid", "rrf"],
                                ks=(1, 5, 20), show_progress=False)
    print(f"\n(b) SQuAD dev: {len(examples):,} questions over {index.size:,} paragraphs "
          f"(index ready in {prepared:.0f} s: {work_dir})")
    print(format_table(scores))
    recall5 = {s.mode: s.recall[5] for s in scores}
    best_single = max(recall5["bm25"], recall5["dense"])
    print(f"  best single retriever R@5 {best_single:.3f}; hybrid {recall5['hybrid']:.3f}, "
          f"rrf {recall5['rrf']:.3f}")
    return {"squad_questions": len(examples), "squad_paragraphs": index.size,
            **{f"recall5_{mode}": round(value, 4) for mode, value in recall5.items()},
            "mrr_hybrid": round(next(s.mrr for s in scores if s.mode == "hybrid"), 4)}


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _dense_child(texts: list[str], shard_size: int, queue: multiprocessing.Queue) -> None:
    from sieverag.inference.retrieval.dense import DenseConfig, DenseIndex, make_encoder

    config = DenseConfig(shard_size=shard_size)
    encoder = make_encoder(config)
    encoder(texts[:64])  # load and warm the model before timing
    rss, peak = [_rss_mb()], [_peak_rss_mb()]

    def record(number: int, total: int) -> None:
        rss.append(_rss_mb())
        peak.append(_peak_rss_mb())

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        DenseIndex.build(texts, Path(tmp), config, encoder=encoder, on_shard=record,
                         show_progress=False)
        seconds = time.perf_counter() - start
    queue.put({"seconds": seconds, "rss": rss, "peak": peak, "after_index": _rss_mb(),
               "final_peak": _peak_rss_mb()})


def bench_dense_indexing(data_dir: Path, chunks: int, shard_size: int) -> dict[str, float]:
    """(c) streaming dense build in a fresh process: chunks/s and memory per shard."""
    texts = small_chunk_texts(data_dir, chunks)[:chunks]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_dense_child, args=(texts, shard_size, queue))
    child.start()
    result = queue.get()
    child.join()
    rss, peak = result["rss"], result["peak"]
    print(f"\n(c) dense indexing: {chunks:,} chunks in {len(rss) - 1} shards of "
          f"{shard_size:,}, {chunks / result['seconds']:.1f} chunks/s")
    print("  MB before the first shard (model loaded), then after each shard:")
    print("  resident " + " ".join(f"{r:.0f}" for r in rss))
    print("  peak     " + " ".join(f"{p:.0f}" for p in peak))
    print(f"  after assembling the FAISS index: resident {result['after_index']:.0f} MB, "
          f"peak {result['final_peak']:.0f} MB")
    return {"dense_index_chunks": chunks,
            "dense_chunks_per_s": round(chunks / result["seconds"], 1),
            "dense_rss_first_shard_mb": round(rss[1], 1),
            "dense_rss_last_shard_mb": round(rss[-1], 1),
            "dense_peak_first_shard_mb": round(peak[1], 1),
            "dense_peak_last_shard_mb": round(peak[-1], 1),
            "dense_peak_rss_mb": round(result["final_peak"], 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small settings, under a minute")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="shared data folder (default $SIEVERAG_DATA_DIR or ../shared/data)")
    parser.add_argument("--squad-questions", type=int, default=None,
                        help="SQuAD questions for recall (default 2000; quick 150)")
    parser.add_argument("--dense-chunks", type=int, default=None,
                        help="chunks to embed for (c) (default 20000; quick 400)")
    parser.add_argument("--shard-size", type=int, default=None,
                        help="embeddings per shard for (c) (default 2000; quick 100)")
    args = parser.parse_args()
    data_dir = args.data_dir or DATA_DIR
    if not (data_dir / "squad_dev_v1.1.json.zip").is_file():
        print(f"shared data not found in {data_dir}; pass --data-dir", file=sys.stderr)
        return 1
    all_examples = load_squad(data_dir / "squad_dev_v1.1.json.zip")[1]
    figures: dict[str, object] = {"quick": args.quick}
    start = time.perf_counter()
    figures |= bench_bm25(data_dir, [e.question for e in
                                     spread_subset(all_examples, 50 if args.quick else 200)])
    if args.quick:
        squad = quick_squad_file(data_dir, QUICK_ARTICLES,
                                 cache_root() / "bench_retrieval" / "squad_quick.json")
        figures |= bench_recall(squad, args.squad_questions or 150)
    else:
        figures |= bench_recall(data_dir / "squad_dev_v1.1.json.zip",
                                args.squad_questions or 2000)
    chunks = args.dense_chunks or (400 if args.quick else 20_000)
    shard_size = args.shard_size or (100 if args.quick else 2000)
    figures |= bench_dense_indexing(data_dir, chunks, shard_size)
    figures["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
