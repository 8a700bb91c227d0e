"""Milvus benchmark: Milvus Lite against the in-process index on the same passages.

Run directly (never collected by pytest; needs the `milvus` extra):

    python tests/benchmarks/bench_retrieval_milvus.py                 # 2,000 passages
    python tests/benchmarks/bench_retrieval_milvus.py --quick         # 300 passages
    python tests/benchmarks/bench_retrieval_milvus.py --passages 100000 --synthetic

Real passages (the default): SQuAD v1.1 dev paragraphs (all 2,067 at most) then HotpotQA
distractor passages, one chunk each, 5,971 in all; the queries are SQuAD dev questions, each
text embedded once with all-MiniLM-L6-v2. `--synthetic` builds the corpus of
`bench_retrieval_scale.py` instead (its `stage_corpus`, one implementation): the 2,067 SQuAD
paragraphs plus synthetic passages drawn from their word frequencies, whose vector is a random
real paragraph's plus noise (cosine about 0.75 to it), queried with 200 real SQuAD questions'
vectors; only the real texts are embedded, so 100,000 passages cost the embedding of 2,067.
Both sides read the same vectors (handed to both builds and to both searches) and index the
same texts for BM25, so dense differences are Milvus's search alone.

Which dense index each side searches: the in-process folder's FAISS Flat, exact; Milvus Lite
3.x, asked for AUTOINDEX (`inference/retrieval/milvus.py`), builds a FAISS HNSW graph per
sealed segment when faiss is importable (`milvus_lite.index.factory`: M 16, efConstruction 200,
searched with ef 64), an approximate index, and searches rows not yet sealed by brute force.
So the dense overlap is an approximate index's recall@10 against exact search (issue 63's
goal: ≥ 0.9); the run prints the index Milvus Lite reports and the one it builds. BM25 overlap
compares two implementations (bm25s with PyStemmer, Milvus's analyzer); hybrid and rrf two
fusions. Reported: build seconds of each side (embedding excluded), top-10 overlap and query
latency p50 per mode, one query at a time, alternating the sides. Ends with one line of JSON;
`--results-json PATH` writes the tables (docs/results/data/retrieval_milvus_100k.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import results_json  # noqa: E402
from bench_data import DATA_DIR  # noqa: E402
from bench_retrieval_scale import QUESTIONS, stage_corpus  # noqa: E402

from sieverag.inference.retrieval.chunking import ChunkingConfig  # noqa: E402
from sieverag.inference.retrieval.config import IndexConfig  # noqa: E402
from sieverag.inference.retrieval.corpus import load_corpus, load_squad  # noqa: E402
from sieverag.inference.retrieval.dense import DenseConfig, make_encoder  # noqa: E402
from sieverag.inference.retrieval.index_folder import SEARCH_MODES, build_index  # noqa: E402
from sieverag.inference.retrieval.milvus import MilvusIndex, build_collection  # noqa: E402

# The first bytes of a FAISS index file name its kind (faiss/impl/index_write.cpp).
FAISS_KINDS = {b"IHNf": "HNSW (FAISS IndexHNSWFlat), approximate",
               b"IxFI": "Flat (FAISS IndexFlatIP), exact",
               b"IxF2": "Flat (FAISS IndexFlatL2), exact",
               b"IwFl": "IVF_FLAT (FAISS), approximate"}


def real_passages(data_dir: Path, count: int, out: Path) -> Path:
    documents = list(load_squad(data_dir / "squad_dev_v1.1.json.zip")[0])
    if len(documents) < count:
        documents += load_corpus(data_dir / "hotpotqa_distractor.jsonl")
    if len(documents) < count:
        raise SystemExit(f"--passages {count:,}: the real passages (SQuAD dev paragraphs, then "
                         f"HotpotQA distractor passages) number {len(documents):,}; add "
                         "--synthetic for bench_retrieval_scale.py's corpus of any size")
    with out.open("w", encoding="utf-8") as handle:
        for d in documents[:count]:
            handle.write(json.dumps({"id": d.id, "title": d.title, "text": d.text}) + "\n")
    return out


def _context(row: dict) -> str:
    return f"{row['title']}\n{row['text']}" if row.get("title") else row["text"]


class MemoEncoder:
    """Each text's vector, embedded once for both builds and both searches. Given `known`
    vectors and `embed=False`, a text without one is an error, never embedded."""

    def __init__(self, known: dict[str, np.ndarray] | None = None, embed: bool = True) -> None:
        self.encode = make_encoder(DenseConfig()) if embed else None
        self.memo: dict[str, np.ndarray] = dict(known or {})

    def __call__(self, texts):
        todo = [t for t in dict.fromkeys(texts) if t not in self.memo]
        if todo and self.encode is None:
            raise KeyError(f"{len(todo)} texts have no staged vector, e.g. {todo[0][:80]!r}")
        if todo:
            self.memo.update(zip(todo, self.encode(todo), strict=True))
        return np.stack([self.memo[t] for t in texts]).astype(np.float32)


def synthetic_corpus(work: Path, count: int) -> tuple[Path, MemoEncoder, list[str], int, bool]:
    """bench_retrieval_scale's corpus of `count` passages, staged in `work` (reused when
    `work` already holds one of that size): the corpus file, an encoder holding every
    passage's and question's vector, the questions, how many passages are real, and whether
    it was reused."""
    corpus = work / "corpus.jsonl"
    reused = (corpus.is_file() and (work / "queries.npy").is_file()
              and sum(1 for _ in corpus.open(encoding="utf-8")) == count)
    if not reused:
        work.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(work / "shards", ignore_errors=True)  # stage_corpus makes it afresh
        stage_corpus(work, count)
    rows = [json.loads(line) for line in corpus.open(encoding="utf-8")]
    vectors = np.concatenate([np.load(path) for path in sorted((work / "shards").glob("*.npy"))])
    questions = json.loads((work / "questions.json").read_text())["questions"]
    # keyed by the text the builds embed: the chunker strips a passage's text
    known = dict(zip([_context({**r, "text": r["text"].strip()}) for r in rows], vectors,
                     strict=True))
    known.update(zip(questions, np.load(work / "queries.npy"), strict=True))
    real = sum(not r["id"].startswith("syn") for r in rows)
    return corpus, MemoEncoder(known, embed=False), questions, real, reused


def milvus_dense_index(milvus: MilvusIndex, db: Path) -> tuple[str, str]:
    """The dense field's index type Milvus reports, and the kind of index files Milvus Lite
    wrote for it (read from their first bytes) on how many of its segments."""
    asked = milvus.client.describe_index(milvus.collection, "dense")["index_type"]
    kinds: Counter[str] = Counter()
    for path in sorted(db.rglob("*.dense.*.idx")):
        with path.open("rb") as handle:
            magic = handle.read(4)
        kinds[FAISS_KINDS.get(magic, f"unknown ({magic!r})")] += 1
    segments = len(list(db.rglob("data_*.parquet")))
    built = ", ".join(f"{kind} on {n} of {segments} segments" for kind, n in kinds.items())
    return asked, built or f"no index on its {segments} segments (searched by brute force)"


def overlap(a, b) -> float:
    return len({h.document.id for h in a} & {h.document.id for h in b}) / max(len(a), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 passages, 50 queries")
    parser.add_argument("--passages", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--synthetic", action="store_true",
                        help="bench_retrieval_scale.py's corpus: SQuAD paragraphs plus synthetic "
                             "passages, any size (real passages only stop at 5,971)")
    parser.add_argument("--work", type=Path, default=None,
                        help="with --synthetic, where the corpus is staged and reused "
                             "(default /tmp/sieverag_bench_milvus/N)")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    results_json.add_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.passages, args.queries = 300, 50
    load_average = os.getloadavg()[0]
    print(f"load average {load_average:.2f} on {os.cpu_count()} cores at the start")
    out = Path(tempfile.mkdtemp(prefix="bench_milvus_"))
    start = time.perf_counter()
    if args.synthetic:
        if args.queries > QUESTIONS:
            raise SystemExit(f"--queries {args.queries}: the synthetic corpus has {QUESTIONS}")
        work = args.work or Path(tempfile.gettempdir()) / "sieverag_bench_milvus" / str(
            args.passages)
        corpus, encoder, questions, real, reused = synthetic_corpus(work, args.passages)
        questions = questions[:args.queries]
        origin = (f"bench_retrieval_scale's corpus: {real:,} SQuAD dev paragraphs + "
                  f"{args.passages - real:,} synthetic passages (a real paragraph's vector plus "
                  f"noise); {'reused' if reused else 'staged'} in {work}, "
                  f"{time.perf_counter() - start:.0f} s (embedding the real texts only)")
    else:
        corpus = real_passages(args.data_dir, args.passages, out / "corpus.jsonl")
        questions = [e.question for e in load_squad(args.data_dir / "squad_dev_v1.1.json.zip")[1]]
        questions = questions[::max(1, len(questions) // args.queries)][:args.queries]
        encoder = MemoEncoder()
        encoder([_context(json.loads(line)) for line in corpus.open(encoding="utf-8")])
        encoder(questions)
        real = args.passages
        origin = (f"real passages (SQuAD dev paragraphs, then HotpotQA); embedded once in "
                  f"{time.perf_counter() - start:.0f} s")
    config = IndexConfig(chunking=ChunkingConfig("none"))
    start = time.perf_counter()
    local = build_index(corpus, out / "index", config, dense_encoder=encoder,
                        show_progress=False)
    local_build = time.perf_counter() - start
    start = time.perf_counter()
    build_collection([str(corpus)], str(out / "milvus.db"), config, encoder=encoder,
                     show_progress=False)
    milvus = MilvusIndex.connect(str(out / "milvus.db"), encoder=encoder)
    # Milvus Lite indexes a flushed segment in the background and searches a segment without
    # its index by brute force; loading the collection again builds every index first.
    milvus.client.release_collection(milvus.collection)
    milvus.client.load_collection(milvus.collection)
    milvus_build = time.perf_counter() - start
    asked, built = milvus_dense_index(milvus, out / "milvus.db")
    print(f"{local.size:,} passages, {len(questions)} SQuAD questions; {origin}\n"
          f"built in process {local_build:.1f} s (dense: FAISS Flat, exact), Milvus Lite "
          f"{milvus_build:.1f} s (embedding excluded; dense index {asked}, built as {built})")
    figures: dict[str, float | int | str] = {
        "passages": local.size, "real_passages": real,
        "queries": len(questions), "local_build_s": round(local_build, 2),
        "milvus_build_s": round(milvus_build, 2), "milvus_dense_index": f"{asked}: {built}",
        "load_average_at_start": round(load_average, 2)}
    rows = []
    for mode in SEARCH_MODES:
        local_ms, milvus_ms, overlaps = [], [], []
        for number, query in enumerate(tqdm(questions, desc=f"{mode} queries", leave=False)):
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
        rows.append([mode, row["overlap"], row["local_p50_ms"], row["milvus_p50_ms"]])
        figures.update({f"{mode}_{k}": round(v, 4) for k, v in row.items()})
    tables = {
        "main": results_json.table(
            ["mode", "top-10 overlap", "in-process p50 ms", "Milvus Lite p50 ms"], rows,
            align=["", "right", "right", "right"], formats=[None, ".3f", ".2f", ".2f"]),
        "build": results_json.table(
            ["side", "dense index", "build s (embedding excluded)"],
            [["in process (index folder)", "FAISS Flat, exact", local_build],
             ["Milvus Lite", f"{asked}: {built}", milvus_build]],
            align=["", "", "right"], formats=[None, None, ".1f"])}
    print(results_json.markdown(tables["main"]))
    print()
    print(results_json.markdown(tables["build"]))
    print(f"\ndense top-10 overlap with Flat {figures['dense_overlap']:.3f} (goal ≥ 0.9: "
          f"{'met' if figures['dense_overlap'] >= 0.9 else 'not met'}; Milvus Lite's "
          f"dense index: {built}); hybrid and rrf are fused by Milvus's own "
          "rankers, so their overlap measures two fusions, not an error")
    if args.results_json:
        results_json.write(args.results_json, tables)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
