"""Bring your own index: an index folder over a FAISS index file someone else built
(FlashRAG's `wiki-18` e5 index, a DPR index) and its corpus (FlashRAG's jsonl with `id`,
`contents`; DPR's `psgs_w100.tsv`), without re-embedding anything.

The folder points at the FAISS file (its absolute path, in `dense/prebuilt.json`) instead of
copying it, and holds the corpus as its chunk store, one chunk per corpus record (row i of
the FAISS index is record i, the order both projects build in). The query encoder is named
by `DenseConfig.model` (a local sentence-transformers folder) with its `query_prefix`
(`query: ` for e5); a query embedded to another width than the index's is an error naming
the model. A BM25 index of the same corpus can be built beside it.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.core.io_utils import write_json_atomic
from sieverag.inference.retrieval import chunk_store
from sieverag.inference.retrieval.bm25 import BM25Config
from sieverag.inference.retrieval.chunk_store import IndexedTexts
from sieverag.inference.retrieval.chunking import ChunkingConfig
from sieverag.inference.retrieval.config import IndexConfig
from sieverag.inference.retrieval.corpus import CorpusFormat
from sieverag.inference.retrieval.dense import (
    PREBUILT_FILE,
    SETTINGS_FILE,
    DenseConfig,
    DenseIndex,
    read_index_mapped,
)
from sieverag.inference.retrieval.index_folder import (
    BM25_DIR,
    DENSE_DIR,
    CorpusFiles,
    Index,
    corpus_identity,
    corpus_paths,
    mark_unfinished,
    prepare_build,
    write_chunks,
)
from sieverag.inference.retrieval.lexical import build_lexical
from sieverag.inference.retrieval.manifest import Manifest, write_manifest


def import_index(faiss_file: Path | str, corpus: CorpusFiles, out_dir: Path | str,
                 dense: DenseConfig, *, corpus_format: CorpusFormat = "auto",
                 bm25: BM25Config | None = None, overwrite: bool = False,
                 show_progress: bool = True) -> Index:
    """An index folder in `out_dir` over the prebuilt `faiss_file` and its `corpus`; the
    corpus must hold one record per indexed vector, in the index's order."""
    source = Path(faiss_file).resolve()
    if not source.is_file():
        raise DatasetError(f"prebuilt FAISS index not found: {source}")
    try:
        vectors = int(read_index_mapped(source).ntotal)
    except RuntimeError as error:
        raise DatasetError(f"{source} is not a FAISS index file FAISS can read "
                           f"({str(error).strip().splitlines()[-1]})") from None
    config = IndexConfig(chunking=ChunkingConfig("none"), bm25=bm25, dense=dense,
                         corpus_format=corpus_format)
    paths, out = corpus_paths(corpus), Path(out_dir)
    documents, formats, engine = prepare_build(paths, out, config, overwrite=overwrite)
    if documents != vectors:
        raise DatasetError(f"corpus {', '.join(map(str, paths))} holds {documents} records but "
                           f"the FAISS index {source} holds {vectors} vectors; import the corpus "
                           "the index was built from")
    mark_unfinished(out)
    store, fingerprint = write_chunks(paths, formats, out, config, show_progress)
    files = list(chunk_store.FILES)
    lexical = None
    if bm25 is not None and engine is not None:
        lexical, names = build_lexical(IndexedTexts(store), out / BM25_DIR, bm25, engine,
                                       total=len(store), show_progress=show_progress)
        files += [f"{BM25_DIR}/{name}" for name in names]
    (out / DENSE_DIR).mkdir(exist_ok=True)
    write_json_atomic(out / DENSE_DIR / SETTINGS_FILE, asdict(dense))
    write_json_atomic(out / DENSE_DIR / PREBUILT_FILE,
                      {"faiss_file": str(source), "vectors": vectors,
                       "bytes": source.stat().st_size})
    files += [f"{DENSE_DIR}/{SETTINGS_FILE}", f"{DENSE_DIR}/{PREBUILT_FILE}"]
    corpus_name, corpus_sha256 = corpus_identity(paths)
    manifest = Manifest(config=config, files=tuple(files), chunk_count=len(store),
                        source_count=documents, corpus=corpus_name,
                        corpus_format=",".join(formats), corpus_sha256=corpus_sha256,
                        fingerprint=fingerprint)
    write_manifest(out, manifest)
    return Index(out, manifest, store, lexical, DenseIndex.load(out / DENSE_DIR))


def prebuilt_source(index_dir: Path | str) -> Path | None:
    """The FAISS file an index folder points at, or None when it holds its own."""
    path = Path(index_dir) / DENSE_DIR / PREBUILT_FILE
    return Path(json.loads(path.read_text("utf-8"))["faiss_file"]) if path.is_file() else None
