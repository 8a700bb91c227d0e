"""BM25 at scale with tantivy (the Rust search library under Quickwit): built with bounded
memory, opened memory-mapped.

It tokenises as `bm25.make_tokenizer` does for bm25s, so the two engines rank alike: the same
word pattern (`\\w\\w+`, lower-cased), the same stop-word list (bm25s's English list), the same
Snowball English stemmer, and Lucene's BM25 (the idf bm25s's `lucene` method uses). What
differs: tantivy fixes k1 = 1.2 and b = 0.75 (bm25s takes any), and stores each document's
length in one byte (Lucene's field norms, exact up to 40 tokens, coarser beyond), so a long
document's length normalisation is slightly off; `tests/inference/retrieval/
test_bm25_engines.py` measures the agreement.

The index keeps each chunk's position in a fast field (a memory-mapped column), so a hit maps
to its chunk without reading any stored document.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

import tantivy
from bm25s.stopwords import STOPWORDS_EN
from tqdm.auto import tqdm

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.io_utils import atomic_directory
from sieverag.inference.retrieval.bm25 import SETTINGS_FILE, BM25Config

TANTIVY_DIR = "tantivy"
FILES = (SETTINGS_FILE, f"{TANTIVY_DIR}/meta.json")
# tantivy's BM25 constants (tantivy::query::bm25), not settable from Python.
TANTIVY_K1 = 1.2
TANTIVY_B = 0.75
_TOKENIZER = "sieverag_bm25"
_WORDS = r"(?u)\b\w\w+\b"  # bm25s's default splitter
_TEXT = "text"
_POSITION = "position"
# Minimum writer memory per thread that tantivy accepts, in MB (it needs 15 MB, with margin).
MIN_HEAP_MB_PER_THREAD = 20


def check_tantivy_config(config: BM25Config) -> None:
    """Refuse settings tantivy cannot honour, naming the fields."""
    if (config.k1, config.b) != (TANTIVY_K1, TANTIVY_B):
        raise ConfigError(
            f"bm25.engine tantivy scores with k1={TANTIVY_K1}, b={TANTIVY_B} (fixed in tantivy), "
            f"but bm25.k1={config.k1}, bm25.b={config.b}: pass --bm25.k1 {TANTIVY_K1} "
            f"--bm25.b {TANTIVY_B}, or --bm25.engine bm25s")
    if config.method != "lucene":
        raise ConfigError(f"bm25.engine tantivy scores as Lucene does; bm25.method "
                          f"{config.method!r} needs --bm25.engine bm25s")
    if config.stemmer not in ("", "english"):
        raise ConfigError(f"bm25.engine tantivy stems English only; bm25.stemmer "
                          f"{config.stemmer!r} needs --bm25.engine bm25s")


def _analyzer(config: BM25Config) -> tantivy.TextAnalyzer:
    builder = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.regex(_WORDS))
    builder = builder.filter(tantivy.Filter.lowercase())
    if config.stopwords == "en":
        builder = builder.filter(tantivy.Filter.custom_stopword(list(STOPWORDS_EN)))
    if config.stemmer:
        builder = builder.filter(tantivy.Filter.stemmer(config.stemmer))
    return builder.build()


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field(_TEXT, stored=False, tokenizer_name=_TOKENIZER, index_option="freq")
    builder.add_unsigned_field(_POSITION, stored=False, indexed=False, fast=True)
    return builder.build()


class TantivyBM25Index:
    """A tantivy BM25 index over chunk texts; positions are corpus order."""

    def __init__(self, index: tantivy.Index, config: BM25Config) -> None:
        self.index = index
        self.config = config
        self._analyzer = _analyzer(config)
        self.searcher = index.searcher()

    @property
    def size(self) -> int:
        return int(self.searcher.num_docs)

    @classmethod
    def build(cls, texts: Iterable[str], directory: Path, config: BM25Config,
              *, total: int | None = None, heap_mb: int = 512, threads: int = 0,
              show_progress: bool = True) -> TantivyBM25Index:
        """Index `texts` (streamed, in order) into `directory`, replacing what was there."""
        check_tantivy_config(config)
        directory = Path(directory)
        with atomic_directory(directory) as tmp:
            (tmp / TANTIVY_DIR).mkdir()
            index = tantivy.Index(_schema(), path=str(tmp / TANTIVY_DIR))
            index.register_tokenizer(_TOKENIZER, _analyzer(config))
            threads = threads or max(1, min(os.cpu_count() or 1, 8,
                                           heap_mb // MIN_HEAP_MB_PER_THREAD))
            writer = index.writer(heap_size=heap_mb * 1_000_000, num_threads=threads)
            for position, text in enumerate(tqdm(texts, total=total, desc="BM25 (tantivy)",
                                                 unit="chunk", disable=not show_progress)):
                document = tantivy.Document()
                document.add_text(_TEXT, text)
                document.add_unsigned(_POSITION, position)
                writer.add_document(document)
            writer.commit()
            writer.wait_merging_threads()
            (tmp / SETTINGS_FILE).write_text(json.dumps(asdict(config), indent=2),
                                             encoding="utf-8")
        return cls.load(directory)

    @classmethod
    def load(cls, directory: Path) -> TantivyBM25Index:
        """Open an index written by `build` (tantivy memory-maps its files)."""
        directory = Path(directory)
        config = BM25Config(**json.loads((directory / SETTINGS_FILE).read_text("utf-8")))
        index = tantivy.Index.open(str(directory / TANTIVY_DIR))
        index.register_tokenizer(_TOKENIZER, _analyzer(config))
        return cls(index, config)

    def query_terms(self, query: str) -> list[str]:
        """The query's terms as the index holds them (stop words dropped, stemmed)."""
        return list(self._analyzer.analyze(query))

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """Top-k (position, score) per query, best first (ties: lower position); a query with
        no indexed word gets []."""
        schema = self.index.schema
        results = []
        for query in queries:
            terms = self.query_terms(query)
            if not terms or k < 1:
                results.append([])
                continue
            # One SHOULD clause per query token, repeats included, as bm25s sums them.
            clauses = [(tantivy.Occur.Should, tantivy.Query.term_query(schema, _TEXT, term))
                       for term in terms]
            hits = self.searcher.search(tantivy.Query.boolean_query(clauses), limit=k,
                                        count=False).hits
            positions = self.searcher.fast_field_values(_POSITION, [a for _, a in hits])
            ranked = sorted(zip(positions, (s for s, _ in hits), strict=True),
                            key=lambda hit: (-hit[1], hit[0]))
            results.append([(int(p), float(s)) for p, s in ranked if s > 0])
        return results
