"""The retrieval commands: `index build`, `index search`, `eval-retrieval` (see `sieverag.cli`).

Each command is a settings class, its fields the command's flags and YAML keys, and a
`run_*` function. The index settings are the library's own configs as sections
(`--chunking.strategy`, `--bm25.k1`, `--dense.batch-size`, `--search.alpha`), so a YAML
`--config` has the shape of the `IndexConfig` an index manifest records.
"""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Literal, get_args

from pydantic_settings import CliPositionalArg

from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.io_utils import cache_root, write_json_atomic
from sieverag.inference.core.settings import FileList, at_least, narrow, settings
from sieverag.inference.core.types import Example
from sieverag.inference.metrics.retrieval import evaluate_retrieval, format_table, spread_subset
from sieverag.inference.retrieval.bm25 import BM25Config
from sieverag.inference.retrieval.cache import cache_key
from sieverag.inference.retrieval.chooser import open_backend
from sieverag.inference.retrieval.chunking import ChunkingConfig, ChunkStrategy
from sieverag.inference.retrieval.config import IndexConfig, SearchConfig
from sieverag.inference.retrieval.corpus import CorpusFormat, load_squad
from sieverag.inference.retrieval.dense import DenseConfig
from sieverag.inference.retrieval.hygiene import HygienePreset, search_with_hygiene
from sieverag.inference.retrieval.index_folder import (
    SEARCH_MODES,
    SearchMode,
    build_index,
    convert_index,
    ensure_index,
)
from sieverag.inference.retrieval.rerank import CrossEncoderReranker
from sieverag.inference.retrieval.search_backend import (
    DEFAULT_COLLECTION,
    DEFAULT_TIMEOUT_S,
    BackendKind,
    IndexSource,
    read_secret,
)

DATA_DIR_ENV = "SIEVERAG_DATA_DIR"
Retriever = Literal["bm25", "dense"]
RETRIEVERS: tuple[str, ...] = get_args(Retriever)
EvalCorpus = Literal["squad"]
# Benchmarks with a gold source per question: name → (file name in $SIEVERAG_DATA_DIR, loader).
EVAL_CORPORA: dict[str, tuple[str, Callable[[Path], tuple[list, list[Example]]]]] = {
    "squad": ("squad_dev_v1.1.json.zip", load_squad),
}


@settings
class IndexBuildCommand:
    """Chunk a corpus file (or several, as one corpus) and write a BM25 and/or dense index
    folder. An interrupted build resumes."""

    corpus: FileList = field(metadata={
        "help": "corpus file(s), comma-separated: jsonl {id, title?, text}, the nutrition "
                "pages, SQuAD json/zip or HotpotQA jsonl (each file's format detected)"})
    out: str | None = field(default=None, metadata={
        "help": "index folder to write (--backend sieverag)"})
    backend: BackendKind = field(default="sieverag", metadata={
        "help": "sieverag: an index folder (--out); milvus: a Milvus collection holding the "
                "chunks, their dense vectors and Milvus's BM25 index (--uri)"})
    uri: str | None = field(default=None, metadata={
        "help": "--backend milvus: a cluster's URI (http://host:19530) or a Milvus Lite file "
                "(a path ending in .db)"})
    collection: str = field(default=DEFAULT_COLLECTION, metadata={
        "help": "--backend milvus: the collection to fill"})
    token_env: str | None = field(default=None, metadata={
        "help": "--backend milvus: environment variable holding Milvus's token "
                "(user:password)"})
    retrievers: tuple[Retriever, ...] = field(default=RETRIEVERS, metadata={
        "help": "indexes to build: bm25, dense or both (comma list)"})
    corpus_format: CorpusFormat = field(default="auto", metadata={
        "help": "corpus file format (auto: detect from the file)"})
    overwrite: bool = field(default=False, metadata={"help": "replace an index already in --out"})
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig, metadata={
        "help": "how documents are cut into chunks"})
    bm25: BM25Config = field(default_factory=BM25Config, metadata={"help": "the BM25 index"})
    dense: DenseConfig = field(default_factory=DenseConfig, metadata={
        "help": "the dense index; an interrupted build resumes from the last finished shard"})

    def __post_init__(self) -> None:
        if not self.retrievers:
            raise ConfigError(f"retrievers must name at least one of {', '.join(RETRIEVERS)}")
        if self.backend == "milvus":
            if self.uri is None or self.out is not None:
                raise ConfigError("--backend milvus writes to a Milvus collection: give --uri "
                                  "(and --collection), not --out")
        elif self.out is None or self.uri is not None:
            raise ConfigError("--out names the index folder to write (--uri is for --backend "
                              "milvus)")

    def index_config(self) -> IndexConfig:
        return IndexConfig(chunking=self.chunking,
                           bm25=self.bm25 if "bm25" in self.retrievers else None,
                           dense=self.dense if "dense" in self.retrievers else None,
                           corpus_format=self.corpus_format)


@settings
class IndexSearchCommand:
    """Search an index and print a ranked list of chunks: an index folder (`sieverag index
    build`), `sieverag index serve` at its URL, or a Milvus collection (--backend milvus),
    opened as `sieverag eval` opens them."""

    index: CliPositionalArg[str] = field(metadata={
        "help": "index folder, the URL of a `sieverag index serve` server (http://host:port), "
                "or with --backend milvus a Milvus URI (http://host:19530) or Milvus Lite file"})
    query: CliPositionalArg[str] = field(metadata={"help": "the query text"})
    backend: BackendKind = field(default="sieverag", metadata={
        "help": "sieverag: INDEX is an index folder or a served index's URL; milvus: INDEX is "
                "a Milvus URI"})
    collection: str | None = field(default=None, metadata={
        "help": f"--backend milvus: the collection `sieverag index build --backend milvus` "
                f"filled (unset: {DEFAULT_COLLECTION})"})
    api_key_env: str | None = field(default=None, metadata={
        "help": "a served index or Milvus: environment variable holding the server's API key "
                "or Milvus's token (user:password)"})
    timeout: float | None = field(default=None, metadata={
        "help": f"a served index or Milvus: seconds it gets to answer the search (unset: "
                f"{DEFAULT_TIMEOUT_S:g})"})
    mode: SearchMode = field(default="hybrid", metadata={
        "help": "bm25, dense, hybrid (weighted min-max fusion) or rrf (reciprocal-rank fusion)"})
    k: int = field(default=10, metadata={"help": "hits to show"})
    hygiene: HygienePreset = field(default="off", metadata={
        "help": "drop non-informative chunks and list them"})
    reranker: str | None = field(default=None, metadata={
        "help": "local cross-encoder folder to re-score the hits"})
    cache: bool | None = field(default=None, metadata={
        "help": "use the index folder's retrieval cache (unset: on); a folder's only: a served "
                "index caches as `sieverag index serve` was started, Milvus keeps none"})
    search: SearchConfig = field(default_factory=SearchConfig, metadata={
        "help": "how searches fuse and rerank (a served index's fusion must be the server's)"})

    def __post_init__(self) -> None:
        at_least(1, k=self.k)
        if self.collection == "":
            raise ConfigError("--collection must name a Milvus collection")
        if self.api_key_env == "":
            raise ConfigError("--api-key-env must name an environment variable")
        if self.timeout is not None and not self.timeout > 0:
            raise ConfigError(f"--timeout must be > 0 seconds, got {self.timeout}")
        try:  # an option INDEX cannot use is refused, not ignored (`IndexSource`)
            source = self.index_source()
        except ConfigError as refused:  # named as this command's flag
            said = re.sub(r"^retrieval\.(\w+)",
                          lambda m: "--" + m.group(1).replace("_", "-"), str(refused))
            raise ConfigError(said) from None
        if self.cache is not None and source.index is None:
            raise ConfigError(f"--cache/--no-cache does not apply to {source.location}: "
                              "drop it")

    def index_source(self) -> IndexSource:
        """The index searched: INDEX as a folder, a served index's URL or a Milvus URI."""
        place = {"collection": self.collection, "api_key_env": self.api_key_env,
                 "timeout": self.timeout}
        if self.backend == "milvus":
            return IndexSource(backend="milvus", uri=self.index, **place)
        if self.index.startswith(("http://", "https://")):
            return IndexSource(endpoint=self.index, **place)
        return IndexSource(index=self.index, **place)


@settings
class IndexImportCommand:
    """Make an index folder over a FAISS index someone else built (FlashRAG's wiki-18 e5
    index, a DPR index) and its corpus, without re-embedding: the folder points at the FAISS
    file, and queries are embedded with --dense.model (and --dense.query-prefix)."""

    faiss: str = field(metadata={"help": "the prebuilt FAISS index file (row i = record i)"})
    corpus: FileList = field(metadata={
        "help": "the corpus the index was built from: FlashRAG jsonl {id, contents}, DPR's "
                "psgs_w100.tsv, or any corpus format index build reads"})
    out: str = field(metadata={"help": "index folder to write"})
    retrievers: tuple[Retriever, ...] = field(default=("dense",), metadata={
        "help": "dense (the prebuilt index), plus bm25 to build a BM25 index of the corpus"})
    corpus_format: CorpusFormat = field(default="auto", metadata={
        "help": "corpus file format (auto: detect from the file)"})
    overwrite: bool = field(default=False, metadata={"help": "replace an index already in --out"})
    bm25: BM25Config = field(default_factory=BM25Config, metadata={"help": "the BM25 index"})
    dense: DenseConfig = field(default_factory=DenseConfig, metadata={
        "help": "the query encoder: the model that embedded the corpus"})

    def __post_init__(self) -> None:
        if "dense" not in self.retrievers:
            raise ConfigError("index import brings a dense index: retrievers must include dense")


@settings
class IndexConvertCommand:
    """Bring an index folder written by an older sieverag to this version's format in place
    (format 1 → 2: adds the chunk store's offsets file; nothing is re-embedded)."""

    index_dir: CliPositionalArg[str] = field(metadata={"help": "index folder"})


@settings
class BenchmarkChunking(ChunkingConfig):
    """How benchmark documents are cut; by default not at all, so a chunk is the unit a
    question's gold source names (a SQuAD paragraph)."""

    strategy: ChunkStrategy = field(default="none", metadata={
        "help": "none (a document is one chunk), tokens (word windows) or sentences"})


@settings
class EvalRetrievalCommand:
    """Index a benchmark corpus (reused when built before, kept in the user cache) and report
    recall@k and MRR per retrieval mode, as a table and as JSON."""

    corpus: EvalCorpus = field(default="squad", metadata={
        "help": "benchmark: squad (SQuAD v1.1 dev paragraphs)"})
    data: str | None = field(default=None, metadata={
        "help": f"benchmark file (default: its file in ${DATA_DIR_ENV}, e.g. "
                f"{EVAL_CORPORA['squad'][0]}); required when ${DATA_DIR_ENV} is unset"})
    modes: tuple[SearchMode, ...] = field(default=SEARCH_MODES, metadata={
        "help": "retrieval modes to score (comma list)"})
    ks: tuple[int, ...] = field(default=(1, 5, 20), metadata={
        "help": "recall cut-offs (comma list)"})
    limit: int | None = field(default=None, metadata={
        "help": "evaluate this many questions, spread evenly (default: all)"})
    index_dir: str | None = field(default=None, metadata={
        "help": "where to build / reuse the benchmark index (default: the user cache)"})
    out: str | None = field(default=None, metadata={
        "help": "results JSON (default retrieval_eval_<corpus>.json)"})
    chunking: BenchmarkChunking = field(default_factory=BenchmarkChunking, metadata={
        "help": "how benchmark documents are cut into chunks"})
    bm25: BM25Config = field(default_factory=BM25Config, metadata={"help": "the BM25 index"})
    dense: DenseConfig = field(default_factory=DenseConfig, metadata={
        "help": "the dense index"})
    search: SearchConfig = field(default_factory=SearchConfig, metadata={
        "help": "how searches fuse and rerank"})

    def __post_init__(self) -> None:
        if not self.modes:
            raise ConfigError(f"modes must name at least one of {', '.join(SEARCH_MODES)}")
        if not self.ks or min(self.ks) < 1:
            raise ConfigError(f"ks must be positive integers, got {list(self.ks)}")
        at_least(1, limit=self.limit)


def default_eval_index_dir(corpus: str, config: IndexConfig, data: Path) -> Path:
    """Where `eval-retrieval` keeps a benchmark index: the user cache, keyed by its inputs."""
    key = cache_key(config.to_dict(), str(data.resolve()))[:12]
    return cache_root() / "retrieval" / f"{corpus}-{key}"


def benchmark_file(corpus: str, data: str | None) -> Path:
    """The benchmark file of `corpus`: `data`, else its file in $SIEVERAG_DATA_DIR."""
    file_name, _ = EVAL_CORPORA[corpus]
    if data:
        path = Path(data)
    elif os.environ.get(DATA_DIR_ENV):
        path = Path(os.environ[DATA_DIR_ENV]) / file_name
    else:
        raise ConfigError(f"eval-retrieval needs the {corpus} benchmark file: pass --data PATH "
                          f"or set ${DATA_DIR_ENV} to the folder holding {file_name}")
    if not path.is_file():
        raise DatasetError(f"{corpus} data not found at {path}; pass --data PATH or set "
                           f"${DATA_DIR_ENV} to the folder holding {file_name}")
    return path


def run_index_build(command: IndexBuildCommand) -> int:
    if command.backend == "milvus":
        from sieverag.inference.retrieval.milvus import build_collection

        collection = build_collection(command.corpus, command.uri or "", command.index_config(),
                                      collection=command.collection,
                                      overwrite=command.overwrite,
                                      token=read_secret(command.token_env, "--token-env"))
        print(f"loaded {collection.source_count} documents as {collection.chunk_count} chunks "
              f"into Milvus collection {command.collection!r} at {command.uri}; search it with "
              f"--retrieval.backend milvus --retrieval.uri {command.uri}")
        return 0
    index = build_index(command.corpus, command.out, command.index_config(),
                        overwrite=command.overwrite)
    manifest = index.manifest
    print(f"indexed {manifest.source_count} documents as {manifest.chunk_count} chunks "
          f"({manifest.corpus_format}) into {command.out}; modes: {', '.join(index.modes)}")
    return 0


def run_index_import(command: IndexImportCommand) -> int:
    from sieverag.inference.retrieval.prebuilt import import_index

    index = import_index(command.faiss, command.corpus, command.out, command.dense,
                         corpus_format=command.corpus_format, overwrite=command.overwrite,
                         bm25=command.bm25 if "bm25" in command.retrievers else None)
    print(f"imported {index.manifest.chunk_count} passages over {command.faiss} into "
          f"{command.out}; modes: {', '.join(index.modes)}")
    return 0


def run_index_convert(command: IndexConvertCommand) -> int:
    manifest = convert_index(command.index_dir)
    print(f"{command.index_dir}: format {manifest.format_version}, "
          f"{manifest.chunk_count} chunks; it loads as it is")
    return 0


def _print_hit(rank: int, hit_id: str, score: float, title: str, text: str) -> None:
    label = f"{hit_id}  [{title}]" if title else hit_id
    print(f"{rank:>3}. {score:8.4f}  {label}")
    body = textwrap.shorten(" ".join(text.split()), width=300, placeholder=" …")
    print(textwrap.indent(textwrap.fill(body, width=96), "     "))


def run_index_search(command: IndexSearchCommand) -> int:
    index = open_backend(command.index_source(), command.search,
                         use_cache=command.cache is not False)
    reranker = CrossEncoderReranker(command.reranker) if command.reranker else None
    report = search_with_hygiene(index, command.query, command.k, command.mode,
                                 command.hygiene, reranker)
    if not report.kept:
        print(f"no results for {command.query!r} (mode {command.mode})")
    for rank, hit in enumerate(report.kept, start=1):
        _print_hit(rank, hit.document.id, hit.score, hit.document.title, hit.text)
    if report.removed:
        print(f"\nevidence hygiene ({command.hygiene}) removed {len(report.removed)}:")
        for removed in report.removed:
            print(f"  - {removed.item.document.id}: {removed.reason}")
    return 0


def run_eval_retrieval(command: EvalRetrievalCommand) -> int:
    data = benchmark_file(command.corpus, command.data)
    ks = sorted(set(command.ks))
    config = IndexConfig(
        chunking=narrow(command.chunking, ChunkingConfig),
        bm25=command.bm25 if any(m != "dense" for m in command.modes) else None,
        dense=command.dense if any(m != "bm25" for m in command.modes) else None,
        corpus_format=command.corpus)
    work_dir = (Path(command.index_dir) if command.index_dir
                else default_eval_index_dir(command.corpus, config, data))
    index = ensure_index(data, work_dir, config, search_config=command.search, use_cache=False)
    _, examples = EVAL_CORPORA[command.corpus][1](data)
    examples = spread_subset(examples, command.limit)
    scores = evaluate_retrieval(index, examples, command.modes, ks)
    print(f"\n{command.corpus}: {len(examples)} questions over {index.manifest.source_count} "
          f"documents ({index.size} chunks)\n")
    print(format_table(scores))
    out = Path(command.out or f"retrieval_eval_{command.corpus}.json")
    write_json_atomic(out, {
        "corpus": command.corpus, "data": str(data), "index_dir": str(work_dir),
        "questions": len(examples), "documents": index.manifest.source_count,
        "chunks": index.size, "alpha": command.search.alpha, "config": config.to_dict(),
        "results": [s.to_dict() for s in scores],
    })
    print(f"\nwrote {out}")
    return 0
