"""Milvus benchmark: Milvus Lite against the in-process index on the same passages.

Run directly (never collected by pytest; needs the `milvus` extra):

    python tests/benchmarks/bench_retrieval_milvus.py                 # 2,000 passages
    python tests/benchmarks/bench_retrieval_milvus.py --quick         # 300 passages
    python tests/benchmarks/bench_retrieval_milvus.py --passages 100000

The passages are SQuAD v1.1 dev paragraphs (all 2,067 at most) then HotpotQA distractor
passages, one chunk each; the queries are SQuAD dev questions. Both sides read the same
all-MiniLM-L6-v2 vectors (each text is embedded once, then handed to both builds), so dense
differences are Milvus's search alone. Reported: build seconds of each side (embedding
excluded), dense top-10 overlap of Milvus with the in-process Flat index (issue 63's goal:
≥ 0.9), BM25 top-10 overlap (two implementations: bm25s with PyStemmer, Milvus's analyzer),
and query latency p50 per mode, one query at a time, alternating the sides. Ends with one line
of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench_data import DATA_DIR  # noqa: E402

from sieverag.inference.retrieval.chunking import ChunkingConfig  # noqa: E402
from sieverag.inference.retrieval.config import IndexConfig  # noqa: E402
from sieverag.inference.retrieval.corpus import load_corpus, load_squad  # noqa: E402
from sieverag.inference.retrieval.dense import DenseConfig, make_encoder  # noqa: E402
from sieverag.inference.retrieval.index_folder import SEARCH_MODES, build_index  # noqa: E402
from sieverag.inference.retrieval.milvus import MilvusIndex, build_collection  # noqa: E402


def passages(data_dir: Path, count: int, out: Path) -> Path:
    documents = list(load_squad(data_dir / "squad_dev_v1.1.json.zip")[0])
    if len(documents) < count:
        documents += load_corpus(data_dir / "hotpotqa_distractor.jsonl")
    with out.open("w", encoding="utf-8") as handle:
        for d in documents[:count]:
            handle.write(json.dumps({"id": d.id, "title": d.title, "text": d.text}) + "\n")
    return out


class MemoEncoder:
    """The embedded encoder, each text embedded once for both builds."""

    def __init__(self) -> None:
        self.encode = make_encoder(DenseConfig())
        self.memo: dict[str, np.ndarray] = {}

    def __call__(self, texts):
        todo = [t for t in dict.fromkeys(texts) if t not in self.memo]
        if todo:
            self.memo.update(zip(todo, self.encode(todo), strict=True))
        return np.stack([self.memo[t] for t in texts]).astype(np.float32)


def overlap(a, b) -> float:
    return len({h.document.id for h in a} & {h.document.id for h in b}) / max(len(a), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 passages, 50 queries")
    parser.add_argument("--passages", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args()
    if args.quick:
        args.passages, args.queries = 300, 50
    work = Path(tempfile.mkdtemp(prefix="bench_milvus_"))
    corpus = passages(args.data_dir, args.passages, work / "corpus.jsonl")
    questions = [e.question for e in load_squad(args.data_dir / "squad_dev_v1.1.json.zip")[1]]
    questions = questions[::max(1, len(questions) // args.queries)][:args.queries]
    encoder = MemoEncoder()
    config = IndexConfig(chunking=ChunkingConfig("none"))
    start = time.perf_counter()
    texts = [json.loads(line) for line in corpus.open(encoding="utf-8")]
    encoder([f"{t['title']}\n{t['text']}" if t["title"] else t["text"] for t in texts])
    encoder(questions)
    embedded = time.perf_counter() - start
    start = time.perf_counter()
    local = build_index(corpus, work / "index", config, dense_encoder=encoder,
                        show_progress=False)
    local_build = time.perf_counter() - start
    start = time.perf_counter()
    build_collection([str(corpus)], str(work / "milvus.db"), config, encoder=encoder,
                     show_progress=False)
    milvus = MilvusIndex.connect(str(work / "milvus.db"), encoder=encoder)
    milvus_build = time.perf_counter() - start
    print(f"{local.size:,} passages, {len(questions)} SQuAD questions; embedded once in "
          f"{embedded:.0f} s; built in process {local_build:.1f} s, Milvus Lite "
          f"{milvus_build:.1f} s (embedding excluded); load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    figures: dict[str, float | int] = {"passages": local.size, "queries": len(questions),
                                       "local_build_s": round(local_build, 2),
                                       "milvus_build_s": round(milvus_build, 2)}
    print(f"{'mode':<8} {'top-10 overlap':>15} {'in-process p50 ms':>18} {'Milvus p50 ms':>14}")
    for mode in SEARCH_MODES:
        local_ms, milvus_ms, overlaps = [], [], []
        for number, query in enumerate(questions):
            sides = [(local, local_ms), (milvus, milvus_ms)]
            found = []
            for index, times in (sides if number % 2 == 0 else sides[::-1]):
                begin = time.perf_counter()
                found.append((index, index.search(query, 10, mode)))
                times.append((time.perf_counter() - begin) * 1000)
            hits = dict((id(i), h) for i, h in found)
            overlaps.append(overlap(hits[id(local)], hits[id(milvus)]))
        row = {"overlap": statistics.mean(overlaps), "local_p50_ms": statistics.median(local_ms),
               "milvus_p50_ms": statistics.median(milvus_ms)}
        print(f"{mode:<8} {row['overlap']:>15.3f} {row['local_p50_ms']:>18.2f} "
              f"{row['milvus_p50_ms']:>14.2f}")
        figures.update({f"{mode}_{k}": round(v, 4) for k, v in row.items()})
    print(f"\ndense top-10 overlap with Flat {figures['dense_overlap']:.3f} (goal ≥ 0.9: "
          f"{'met' if figures['dense_overlap'] >= 0.9 else 'not met'}); hybrid and rrf are "
          "fused by Milvus's own rankers, so their overlap measures two fusions, not an error")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
