"""Retrieval subcommands for the `sieverag` CLI: `index build`, `index search`, `eval-retrieval`.

`register(subparsers)` adds them to the main parser; each sets `func`, a function taking the
parsed arguments and returning the exit code. User errors raise `SieveragError` subclasses,
which the main CLI prints as one line.
"""

from __future__ import annotations

import argparse
import os
import textwrap
from collections.abc import Callable
from pathlib import Path

import platformdirs

from sieverag.inference.errors import ConfigError, DatasetError
from sieverag.inference.io_utils import write_json_atomic
from sieverag.inference.retrieval.bm25 import BM25Config
from sieverag.inference.retrieval.cache import cache_key
from sieverag.inference.retrieval.chunking import CHUNK_STRATEGIES, ChunkingConfig
from sieverag.inference.retrieval.config import IndexConfig, SearchConfig
from sieverag.inference.retrieval.corpus import CORPUS_FORMATS, load_squad
from sieverag.inference.retrieval.dense import DenseConfig
from sieverag.inference.retrieval.evaluation import evaluate_retrieval, format_table, spread_subset
from sieverag.inference.retrieval.hygiene import HYGIENE_PRESETS, apply_hygiene
from sieverag.inference.retrieval.index import SEARCH_MODES, Index, build_index, ensure_index
from sieverag.inference.retrieval.rerank import CrossEncoderReranker
from sieverag.inference.types import Example

DATA_DIR_ENV = "SIEVERAG_DATA_DIR"
# Benchmarks with a gold source per question: name → (default file name, loader).
EVAL_CORPORA: dict[str, tuple[str, Callable[[Path], tuple[list, list[Example]]]]] = {
    "squad": ("squad_dev_v1.1.json.zip", load_squad),
}


def default_data_dir() -> Path:
    """$SIEVERAG_DATA_DIR, else the shared data folder next to the project checkout."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    return Path(__file__).resolve().parents[3] / "shared" / "data"


def default_eval_index_dir(corpus: str, config: IndexConfig, data: Path) -> Path:
    """Where `eval-retrieval` keeps a benchmark index: the user cache, keyed by its inputs."""
    key = cache_key(config.to_dict(), str(data.resolve()))[:12]
    return Path(platformdirs.user_cache_dir("sieverag")) / "retrieval" / f"{corpus}-{key}"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _add_chunk_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--chunk", choices=CHUNK_STRATEGIES, default=default,
                        help=f"chunk by word windows (tokens), by sentences, or not at all "
                             f"(default {default})")
    parser.add_argument("--chunk-size", type=_positive_int, default=None,
                        help="words (tokens) or sentences per chunk (default 200 / 5)")
    parser.add_argument("--chunk-overlap", type=int, default=None,
                        help="words or sentences shared by neighbouring chunks (default 40 / 1)")
    parser.add_argument("--embedding-model", default="all-minilm-l6-v2",
                        help="embedded model name or a local sentence-transformers folder "
                             "(default all-minilm-l6-v2)")
    parser.add_argument("--batch-size", type=_positive_int, default=64,
                        help="texts per embedding batch (default 64)")
    parser.add_argument("--shard-size", type=_positive_int, default=2048,
                        help="embeddings per on-disk shard; an interrupted build resumes "
                             "from the last finished one (default 2048)")


def _index_config(args: argparse.Namespace, bm25: bool, dense: bool,
                  corpus_format: str = "auto") -> IndexConfig:
    return IndexConfig(
        chunking=ChunkingConfig(args.chunk, args.chunk_size, args.chunk_overlap),
        bm25=BM25Config() if bm25 else None,
        dense=DenseConfig(model=args.embedding_model, batch_size=args.batch_size,
                          shard_size=args.shard_size) if dense else None,
        corpus_format=corpus_format,  # type: ignore[arg-type]
    )


def run_index_build(args: argparse.Namespace) -> int:
    """`sieverag index build`: chunk and index a corpus file."""
    both = not args.bm25 and not args.dense
    config = _index_config(args, args.bm25 or both, args.dense or both, args.corpus_format)
    index = build_index(args.corpus, args.out, config, overwrite=args.overwrite)
    manifest = index.manifest
    print(f"indexed {manifest.source_count} documents as {manifest.chunk_count} chunks "
          f"({manifest.corpus_format}) into {args.out}; modes: {', '.join(index.modes)}")
    return 0


def _print_hit(rank: int, hit_id: str, score: float, title: str, text: str) -> None:
    label = f"{hit_id}  [{title}]" if title else hit_id
    print(f"{rank:>3}. {score:8.4f}  {label}")
    body = textwrap.shorten(" ".join(text.split()), width=300, placeholder=" …")
    print(textwrap.indent(textwrap.fill(body, width=96), "     "))


def run_index_search(args: argparse.Namespace) -> int:
    """`sieverag index search`: print the ranked hits for one query."""
    index = Index.load(args.index_dir, search_config=SearchConfig(alpha=args.alpha),
                       use_cache=not args.no_cache)
    reranker = CrossEncoderReranker(args.reranker) if args.reranker else None
    fetch = args.k if args.hygiene == "off" else args.k * 3
    hits = index.search(args.query, fetch, args.mode, reranker)
    report = apply_hygiene(hits, args.hygiene)
    kept = report.kept[: args.k]
    if not kept:
        print(f"no results for {args.query!r} (mode {args.mode})")
    for rank, hit in enumerate(kept, start=1):
        _print_hit(rank, hit.document.id, hit.score, hit.document.title, hit.text)
    if report.removed:
        print(f"\nevidence hygiene ({args.hygiene}) removed {len(report.removed)}:")
        for removed in report.removed:
            print(f"  - {removed.item.document.id}: {removed.reason}")
    return 0


def _parse_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in SEARCH_MODES]
    if unknown or not modes:
        raise ConfigError(f"--mode takes a comma list of {', '.join(SEARCH_MODES)}, got {text!r}")
    return modes


def _parse_ks(text: str) -> list[int]:
    try:
        ks = sorted({int(k) for k in text.split(",") if k.strip()})
    except ValueError:
        ks = []
    if not ks or ks[0] < 1:
        raise ConfigError(f"--k takes a comma list of positive integers, got {text!r}")
    return ks


def run_eval_retrieval(args: argparse.Namespace) -> int:
    """`sieverag eval-retrieval`: recall@k and MRR of each mode on a benchmark corpus."""
    modes, ks = _parse_modes(args.mode), _parse_ks(args.k)
    file_name, loader = EVAL_CORPORA[args.corpus]
    data = args.data or default_data_dir() / file_name
    if not Path(data).is_file():
        raise DatasetError(f"{args.corpus} data not found at {data}; pass --data PATH")
    needs_bm25 = any(m != "dense" for m in modes)
    needs_dense = any(m != "bm25" for m in modes)
    config = _index_config(args, needs_bm25, needs_dense, args.corpus)
    work_dir = args.index_dir or default_eval_index_dir(args.corpus, config, Path(data))
    index = ensure_index(data, work_dir, config, search_config=SearchConfig(alpha=args.alpha),
                         use_cache=False)
    _, examples = loader(Path(data))
    examples = spread_subset(examples, args.limit)
    scores = evaluate_retrieval(index, examples, modes, ks)  # type: ignore[arg-type]
    print(f"\n{args.corpus}: {len(examples)} questions over {index.manifest.source_count} "
          f"documents ({index.size} chunks)\n")
    print(format_table(scores))
    out = args.out or Path(f"retrieval_eval_{args.corpus}.json")
    write_json_atomic(Path(out), {
        "corpus": args.corpus, "data": str(data), "index_dir": str(work_dir),
        "questions": len(examples), "documents": index.manifest.source_count,
        "chunks": index.size, "alpha": args.alpha, "config": config.to_dict(),
        "results": [s.to_dict() for s in scores],
    })
    print(f"\nwrote {out}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `index` (with `build` and `search`) and `eval-retrieval` to a subparsers action."""
    index = subparsers.add_parser(
        "index", help="build or search a retrieval index",
        description="Build a BM25 / dense retrieval index from a corpus file, or search one.")
    actions = index.add_subparsers(dest="index_command", required=True, metavar="{build,search}")

    build = actions.add_parser(
        "build", help="chunk a corpus and index it",
        description="Chunk a corpus file and write a BM25 and/or dense index folder. With "
                    "neither --bm25 nor --dense, both are built. An interrupted build resumes.")
    build.add_argument("--corpus", type=Path, required=True,
                       help="corpus file: jsonl {id, title?, text}, the nutrition pages, "
                            "SQuAD json/zip or HotpotQA jsonl")
    build.add_argument("--out", type=Path, required=True, help="index folder to write")
    build.add_argument("--bm25", action="store_true", help="build the BM25 index")
    build.add_argument("--dense", action="store_true", help="build the dense index")
    build.add_argument("--corpus-format", choices=CORPUS_FORMATS, default="auto",
                       help="corpus file format (default: detect from the file)")
    build.add_argument("--overwrite", action="store_true",
                       help="replace an index already in --out")
    _add_chunk_arguments(build, default="tokens")
    build.set_defaults(func=run_index_build)

    search = actions.add_parser(
        "search", help="print the top-k chunks for a query",
        description="Search an index folder and print a ranked list of chunks.")
    search.add_argument("index_dir", type=Path, help="index folder (from `index build`)")
    search.add_argument("query", help="the query text")
    search.add_argument("--mode", choices=SEARCH_MODES, default="hybrid",
                        help="bm25, dense, hybrid (weighted min-max fusion) or rrf "
                             "(reciprocal-rank fusion); default hybrid")
    search.add_argument("-k", type=_positive_int, default=10, help="hits to show (default 10)")
    search.add_argument("--alpha", type=float, default=0.5,
                        help="hybrid weight of the dense score (default 0.5)")
    search.add_argument("--hygiene", choices=HYGIENE_PRESETS, default="off",
                        help="drop non-informative chunks and list them (default off)")
    search.add_argument("--reranker", default=None,
                        help="local cross-encoder folder to re-score the hits")
    search.add_argument("--no-cache", action="store_true", help="skip the retrieval cache")
    search.set_defaults(func=run_index_search)

    evaluate = subparsers.add_parser(
        "eval-retrieval", help="recall@k and MRR of retrieval modes on a benchmark",
        description="Index a benchmark corpus (reused when built before) and report "
                    "recall@k and MRR per retrieval mode, as a table and as JSON.")
    evaluate.add_argument("--corpus", choices=sorted(EVAL_CORPORA), default="squad",
                          help="benchmark (default squad: SQuAD v1.1 dev paragraphs)")
    evaluate.add_argument("--data", type=Path, default=None,
                          help=f"benchmark file (default: ${DATA_DIR_ENV} or ../shared/data)")
    evaluate.add_argument("--mode", default=",".join(SEARCH_MODES),
                          help="comma list of modes (default bm25,dense,hybrid,rrf)")
    evaluate.add_argument("--k", default="1,5,20", help="recall cut-offs (default 1,5,20)")
    evaluate.add_argument("--limit", type=_positive_int, default=None,
                          help="evaluate this many questions, spread evenly (default all)")
    evaluate.add_argument("--alpha", type=float, default=0.5,
                          help="hybrid weight of the dense score (default 0.5)")
    evaluate.add_argument("--index-dir", type=Path, default=None,
                          help="where to build / reuse the benchmark index "
                               "(default: the user cache folder)")
    evaluate.add_argument("--out", type=Path, default=None,
                          help="results JSON (default retrieval_eval_<corpus>.json)")
    _add_chunk_arguments(evaluate, default="none")
    evaluate.set_defaults(func=run_eval_retrieval)

