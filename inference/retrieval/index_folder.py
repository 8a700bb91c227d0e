"""The index facade: build an index folder from a corpus file, load it, search it.

Folder layout (all listed in `manifest.json`, which is written last):

    manifest.json          format version, config, corpus, chunk fingerprint, file list
    chunks.jsonl           one chunk per line: id, source_id, position, text, title
    chunks.offsets         where each line starts (the chunk store, read by position)
    bm25/                  bm25s index + its tokenizer vocabulary, or a tantivy index
    dense/                 dense.faiss + settings (+ vectors.npy for exact re-ranking)
    retrieval_cache.jsonl  cached rankings (not part of the index; safe to delete)

Both retrievers index a chunk's title line plus its text (`Document.as_context`).

A build streams: the corpus is checked in one pass, then read again document by document
into chunks written straight to the chunk store; BM25 and the dense shards read their texts
back from the store. No stage holds the corpus, its chunks or their texts at once.
A loaded index maps its chunk store and reads a chunk when a ranking returns it.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal, get_args

from tqdm.auto import tqdm

from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.retrieval import chunk_store
from sieverag.inference.retrieval.cache import RetrievalCache, cache_key
from sieverag.inference.retrieval.chunk_store import (
    CHUNKS_FILE,
    ChunkStore,
    IndexedTexts,
    write_chunk_store,
    write_offsets,
)
from sieverag.inference.retrieval.chunking import Chunk, iter_chunks
from sieverag.inference.retrieval.config import IndexConfig, SearchConfig
from sieverag.inference.retrieval.corpus import iter_corpora, scan_corpora
from sieverag.inference.retrieval.dense import DenseIndex, Encoder, ShardCallback
from sieverag.inference.retrieval.hybrid import reciprocal_rank_fusion, weighted_fusion
from sieverag.inference.retrieval.lexical import (
    LexicalIndex,
    build_lexical,
    choose_engine,
    load_lexical,
)
from sieverag.inference.retrieval.manifest import (
    CONVERTIBLE_VERSIONS,
    FORMAT_VERSION,
    MANIFEST_FILE,
    IndexFormatError,
    Manifest,
    file_sha256,
    read_manifest,
    write_manifest,
)
from sieverag.inference.retrieval.rerank import HitReranker
from sieverag.inference.retrieval.retrieved import Ranking, RetrievedDocument

SearchMode = Literal["bm25", "dense", "hybrid", "rrf"]
SEARCH_MODES: tuple[str, ...] = get_args(SearchMode)
CACHE_FILE = "retrieval_cache.jsonl"
BM25_DIR = "bm25"
DENSE_DIR = "dense"


def _fingerprint_bytes(chunk: Chunk) -> bytes:
    return f"{chunk.id}\x00{chunk.title}\x00{chunk.text}\x00".encode()


def chunks_fingerprint(chunks: Iterable[Chunk]) -> str:
    """Identifies the indexed chunks (ids and texts); cache keys include it."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(_fingerprint_bytes(chunk))
    return digest.hexdigest()


# One corpus file, or several indexed as one corpus.
CorpusFiles = Path | str | Sequence[Path | str]


def corpus_paths(corpus: CorpusFiles) -> list[Path]:
    """The corpus files, as a list."""
    return [Path(corpus)] if isinstance(corpus, (str, Path)) else [Path(p) for p in corpus]


def corpus_identity(paths: Sequence[Path]) -> tuple[str, str]:
    """What the manifest records of the corpus files: their resolved paths (comma-joined)
    and SHA-256 (one file: its own; several: of their hashes in order)."""
    hashes = [file_sha256(p) for p in paths]
    combined = (hashes[0] if len(hashes) == 1
                else hashlib.sha256("\n".join(hashes).encode()).hexdigest())
    return ",".join(str(p.resolve()) for p in paths), combined


def prepare_build(paths: Sequence[Path], out: Path, config: IndexConfig, *,
                  overwrite: bool) -> tuple[int, list[str], str | None]:
    """Check the output folder and the corpus (one pass; nothing is written); returns the
    number of source documents, each file's format and the BM25 engine (None without BM25).
    Call `mark_unfinished` before writing."""
    if not paths:
        raise ConfigError("no corpus file given")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"index output {out} exists and is not a folder")
    if (out / MANIFEST_FILE).exists() and not overwrite:
        raise ConfigError(f"{out} already holds an index; pass --overwrite to rebuild it "
                          "or choose another --out")
    document_count, formats = scan_corpora(paths, config.corpus_format)
    engine = choose_engine(config.bm25, document_count) if config.bm25 is not None else None
    return document_count, formats, engine


def mark_unfinished(out: Path) -> None:
    """Create the folder and drop its manifest and cache: a crash mid-rebuild cannot leave a
    stale manifest."""
    (out / MANIFEST_FILE).unlink(missing_ok=True)
    (out / CACHE_FILE).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


def write_chunks(paths: Sequence[Path], formats: Sequence[str], out: Path,
                 config: IndexConfig, show_progress: bool = True) -> tuple[ChunkStore, str]:
    """Stream the corpus, document by document, into the folder's chunk store; returns the
    store and the chunks' fingerprint."""
    digest = hashlib.sha256()
    with write_chunk_store(out) as writer:
        chunks = iter_chunks(iter_corpora(paths, formats), config.chunking)
        for chunk in tqdm(chunks, desc="Chunking", unit="chunk", disable=not show_progress):
            writer.add(chunk)
            digest.update(_fingerprint_bytes(chunk))
    if writer.count == 0:
        raise DatasetError(f"corpus {', '.join(map(str, paths))} produced no chunks")
    return ChunkStore(out), digest.hexdigest()


def build_index(corpus_path: CorpusFiles, out_dir: Path | str,
                config: IndexConfig | None = None, *, overwrite: bool = False,
                on_shard: ShardCallback | None = None, dense_encoder: Encoder | None = None,
                show_progress: bool = True) -> Index:
    """Chunk a corpus file (or several, as one corpus) and index it into `out_dir`; returns
    the index (no cache).

    An interrupted build resumes on the next call (dense embeddings restart after the last
    finished shard). A folder that already holds a finished index needs `overwrite=True`.
    `on_shard(number, total)` runs after each dense shard; `dense_encoder` replaces the
    configured embedding model (tests).
    """
    config = config if config is not None else IndexConfig()
    paths, out = corpus_paths(corpus_path), Path(out_dir)
    document_count, formats, engine = prepare_build(paths, out, config, overwrite=overwrite)
    mark_unfinished(out)
    store, fingerprint = write_chunks(paths, formats, out, config, show_progress)
    texts = IndexedTexts(store)
    files = list(chunk_store.FILES)

    bm25: LexicalIndex | None = None
    if config.bm25 is None or engine is None:
        shutil.rmtree(out / BM25_DIR, ignore_errors=True)
    else:
        bm25, bm25_names = build_lexical(texts, out / BM25_DIR, config.bm25, engine,
                                         total=len(texts), show_progress=show_progress)
        files += [f"{BM25_DIR}/{name}" for name in bm25_names]

    dense: DenseIndex | None = None
    if config.dense is None:
        shutil.rmtree(out / DENSE_DIR, ignore_errors=True)
    else:
        dense = DenseIndex.build(texts, out / DENSE_DIR, config.dense, encoder=dense_encoder,
                                 on_shard=on_shard, show_progress=show_progress)
        files += [f"{DENSE_DIR}/{name}" for name in dense.files]

    corpus, corpus_sha256 = corpus_identity(paths)
    manifest = Manifest(config=config, files=tuple(files), chunk_count=len(store),
                        source_count=document_count, corpus=corpus,
                        corpus_format=",".join(formats), corpus_sha256=corpus_sha256,
                        fingerprint=fingerprint)
    write_manifest(out, manifest)
    return Index(out, manifest, store, bm25, dense)


def convert_index(directory: Path | str) -> Manifest:
    """Bring an index folder of an older format (see `manifest.CONVERTIBLE_VERSIONS`) to
    this one in place, reading its chunks once; returns the new manifest."""
    directory = Path(directory)
    for version in CONVERTIBLE_VERSIONS:
        try:
            old = read_manifest(directory, version=version)
        except IndexFormatError:
            continue
        count = write_offsets(directory)
        if count != old.chunk_count:
            raise IndexFormatError(f"index {directory}: {CHUNKS_FILE} holds {count} chunks, the "
                                   f"manifest says {old.chunk_count}; rebuild it with "
                                   "`sieverag index build --overwrite`")
        files = tuple(dict.fromkeys((*old.files, *chunk_store.FILES)))
        manifest = replace(old, files=files, format_version=FORMAT_VERSION)
        write_manifest(directory, manifest)
        return manifest
    return read_manifest(directory)


class Index:
    """A loaded index folder: its chunks (a `ChunkStore`, read by position), its
    retrievers, its retrieval cache."""

    def __init__(self, directory: Path, manifest: Manifest, chunks: Sequence[Chunk],
                 bm25: LexicalIndex | None, dense: DenseIndex | None, *,
                 search_config: SearchConfig | None = None,
                 cache: RetrievalCache | None = None) -> None:
        self.directory = directory
        self.manifest = manifest
        self.chunks = chunks
        self.bm25 = bm25
        self.dense = dense
        self.search_config = search_config if search_config is not None else SearchConfig()
        if dense is not None:
            dense.set_search(self.search_config.nprobe, self.search_config.ef_search,
                             self.search_config.rerank_factor)
        self.cache = cache

    @classmethod
    def load(cls, directory: Path | str, *, search_config: SearchConfig | None = None,
             cache_path: Path | str | None = None, use_cache: bool = True,
             dense_encoder: Encoder | None = None) -> Index:
        """Open an index folder; the cache defaults to `<dir>/retrieval_cache.jsonl`."""
        directory = Path(directory)
        manifest = read_manifest(directory)
        try:
            chunks = ChunkStore(directory)
            bm25 = (load_lexical(directory / BM25_DIR)
                    if manifest.config.bm25 is not None else None)
            dense = (DenseIndex.load(directory / DENSE_DIR, dense_encoder)
                     if manifest.config.dense is not None else None)
        except (OSError, ValueError, TypeError, KeyError, RuntimeError) as error:
            raise IndexFormatError(f"index {directory} is damaged ({error}); rebuild it with "
                                   "`sieverag index build --overwrite`") from None
        if len(chunks) != manifest.chunk_count:
            raise IndexFormatError(f"index {directory}: {CHUNKS_FILE} holds {len(chunks)} chunks, "
                                   f"the manifest says {manifest.chunk_count}; rebuild it")
        cache = None
        if use_cache:
            cache = RetrievalCache(Path(cache_path) if cache_path else directory / CACHE_FILE)
        return cls(directory, manifest, chunks, bm25, dense, search_config=search_config,
                   cache=cache)

    @property
    def size(self) -> int:
        """Number of chunks."""
        return len(self.chunks)

    @property
    def modes(self) -> tuple[str, ...]:
        """The search modes this index supports."""
        return tuple(m for m in SEARCH_MODES if self._missing(m) is None)

    def _missing(self, mode: str) -> str | None:
        have = {"bm25": self.bm25 is not None, "dense": self.dense is not None}
        lacking = [name for name in _NEEDS[mode] if not have[name]]
        return ", ".join(lacking) or None

    def _hit(self, position: int, score: float) -> RetrievedDocument:
        chunk = self.chunks[position]
        return RetrievedDocument(chunk.to_document(), score, chunk.source_id)

    def search(self, query: str, k: int = 10, mode: SearchMode = "hybrid",
               reranker: HitReranker | None = None) -> list[RetrievedDocument]:
        """The top-k chunks for `query`, best first (fewer when fewer match; [] if empty)."""
        return self.search_many([query], k, mode, reranker)[0]

    def search_many(self, queries: Sequence[str], k: int = 10, mode: SearchMode = "hybrid",
                    reranker: HitReranker | None = None) -> list[list[RetrievedDocument]]:
        """`search` for each query, batched; cached rankings are reused."""
        if mode not in SEARCH_MODES:
            raise ConfigError(f"search mode must be one of {', '.join(SEARCH_MODES)}, "
                              f"got {mode!r}")
        missing = self._missing(mode)
        if missing:
            raise ConfigError(f"index {self.directory} was built without {missing}, so it cannot "
                              f"search in mode {mode!r}; it supports: {', '.join(self.modes)}")
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        fetch = max(k, self.search_config.rerank_depth) if reranker is not None else k
        config = self.search_config
        settings: tuple = (config.alpha, config.rrf_k, config.candidates)
        if mode != "bm25" and self.dense is not None and self.dense.config.index != "Flat":
            # Approximate dense searches depend on their search settings too.
            settings += (config.nprobe, config.ef_search, config.rerank_factor)
        keys = [cache_key(q, mode, fetch, settings, self.manifest.fingerprint) for q in queries]
        rankings: dict[str, Ranking] = {}
        todo: dict[str, str] = {}
        for query, key in zip(queries, keys, strict=True):
            cached = self.cache.get(key) if self.cache is not None else None
            if not query.strip():
                rankings[key] = []
            elif cached is not None:
                rankings[key] = cached
            else:
                todo[key] = query
        if todo:
            fresh = dict(zip(todo, _RANKERS[mode](self, list(todo.values()), fetch), strict=True))
            rankings.update(fresh)
            if self.cache is not None:
                self.cache.put_many(fresh)
        results = []
        for query, key in zip(queries, keys, strict=True):
            hits = [self._hit(p, s) for p, s in rankings[key]]
            if reranker is not None:
                hits = reranker.rerank(query, hits)
            results.append(hits[:k])
        return results

    def iter_search(self, queries: Sequence[str], k: int = 10, mode: SearchMode = "hybrid",
                    batch_size: int = 256, show_progress: bool = True
                    ) -> list[list[RetrievedDocument]]:
        """`search_many` in batches with a progress bar (for evaluations)."""
        results: list[list[RetrievedDocument]] = []
        with tqdm(total=len(queries), desc=f"Retrieving ({mode})", unit="query",
                  disable=not show_progress) as bar:
            for start in range(0, len(queries), batch_size):
                batch = queries[start : start + batch_size]
                results.extend(self.search_many(batch, k, mode))
                bar.update(len(batch))
        return results


def _bm25_rankings(index: Index, queries: list[str], k: int) -> list[Ranking]:
    assert index.bm25 is not None  # checked by Index._missing
    return index.bm25.search(queries, k)


def _dense_rankings(index: Index, queries: list[str], k: int) -> list[Ranking]:
    assert index.dense is not None  # checked by Index._missing
    return index.dense.search(queries, k)


def _both(index: Index, queries: list[str], k: int) -> tuple[list[Ranking], list[Ranking]]:
    depth = max(k, index.search_config.candidates)
    return _bm25_rankings(index, queries, depth), _dense_rankings(index, queries, depth)


def _hybrid_rankings(index: Index, queries: list[str], k: int) -> list[Ranking]:
    alpha = index.search_config.alpha
    pairs = zip(*_both(index, queries, k), strict=True)
    return [weighted_fusion(b, d, alpha)[:k] for b, d in pairs]


def _rrf_rankings(index: Index, queries: list[str], k: int) -> list[Ranking]:
    rrf_k = index.search_config.rrf_k
    pairs = zip(*_both(index, queries, k), strict=True)
    return [reciprocal_rank_fusion([b, d], rrf_k)[:k] for b, d in pairs]


_RANKERS: dict[str, Callable[[Index, list[str], int], list[Ranking]]] = {
    "bm25": _bm25_rankings,
    "dense": _dense_rankings,
    "hybrid": _hybrid_rankings,
    "rrf": _rrf_rankings,
}
_NEEDS: dict[str, tuple[str, ...]] = {
    "bm25": ("bm25",), "dense": ("dense",), "hybrid": ("bm25", "dense"), "rrf": ("bm25", "dense"),
}


def ensure_index(corpus_path: CorpusFiles, out_dir: Path | str, config: IndexConfig, *,
                 search_config: SearchConfig | None = None, use_cache: bool = True,
                 show_progress: bool = True) -> Index:
    """Load the index in `out_dir` if it was built from this corpus file (same path and
    bytes) with this config, else (re)build it there (resuming an interrupted build)."""
    paths, out = corpus_paths(corpus_path), Path(out_dir)
    manifest: Manifest | None = None
    if (out / MANIFEST_FILE).is_file():
        try:
            manifest = read_manifest(out)
        except DatasetError:
            manifest = None
    if (manifest is None or manifest.config != config
            or (manifest.corpus, manifest.corpus_sha256) != corpus_identity(paths)):
        build_index(paths, out, config, overwrite=True, show_progress=show_progress)
    return Index.load(out, search_config=search_config, use_cache=use_cache)
