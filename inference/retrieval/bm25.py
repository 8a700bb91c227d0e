"""BM25 retrieval with `bm25s`: English stemming and stop words, vocabulary saved with the index.

`BM25Config.engine` picks the engine of an index: bm25s (this module) for small corpora,
tantivy (`tantivy_bm25`) for large ones; `lexical` chooses, builds and loads.

The tokenizer's vocabulary (word → stem → id) is written next to the bm25s index and read
back at load time, so a query is tokenised exactly as the corpus was: no re-tokenising of the
corpus, no drift. A query with no known content word (e.g. only stop words) scores nothing and
returns an empty result.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, field
from pathlib import Path
from typing import Literal

import bm25s
import numpy as np
import Stemmer
from bm25s.tokenization import Tokenized, Tokenizer

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.io_utils import atomic_directory
from sieverag.inference.core.settings import at_least, settings

BM25Engine = Literal["auto", "bm25s", "tantivy"]
BM25Method = Literal["lucene", "robertson", "atire", "bm25l", "bm25+"]
StopWords = Literal["en", "none"]
SETTINGS_FILE = "settings.json"
VOCAB_FILE = "vocab.tokenizer.json"
STOPWORDS_FILE = "stopwords.tokenizer.json"
# Written by bm25s.BM25.save with its default names.
BM25S_FILES = ("data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy",
               "vocab.index.json", "params.index.json")
FILES = (*BM25S_FILES, VOCAB_FILE, STOPWORDS_FILE, SETTINGS_FILE)
# Texts tokenised at a time while building (the token ids are kept, the texts are not).
_TOKENIZE_BATCH = 10_000


@settings
class BM25Config:
    """BM25 scoring and tokenisation settings."""

    method: BM25Method = field(default="lucene", metadata={
        "help": "bm25s scoring variant; 'robertson' matches rank_bm25's BM25Okapi"})
    k1: float = field(default=1.5, metadata={"help": "term-frequency saturation"})
    b: float = field(default=0.75, metadata={"help": "document-length normalisation"})
    stemmer: str = field(default="english", metadata={
        "help": "PyStemmer (Snowball) language, or '' for no stemming"})
    stopwords: StopWords = field(default="en", metadata={"help": "stop-word list: en or none"})
    engine: BM25Engine = field(default="auto", metadata={
        "help": "bm25s (in memory, any k1/b/method), tantivy (on disk, memory-mapped; k1=1.2, "
                "b=0.75, lucene, English), or auto: bm25s below 200,000 documents, tantivy "
                "from there"})
    heap_mb: int = field(default=512, metadata={
        "help": "tantivy's indexing memory (MB, all threads); bounds a tantivy build's memory"})

    def __post_init__(self) -> None:
        at_least(32, "bm25.", heap_mb=self.heap_mb)
        if self.k1 < 0 or not 0 <= self.b <= 1:
            raise ConfigError(f"bm25 needs k1 >= 0 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")
        if self.stemmer and self.stemmer not in Stemmer.algorithms():
            raise ConfigError(f"bm25.stemmer {self.stemmer!r} is not a PyStemmer language "
                              f"({', '.join(Stemmer.algorithms())})")


def make_tokenizer(config: BM25Config) -> Tokenizer:
    """A bm25s tokenizer (lower-case, words of 2+ characters) with the config's stemmer."""
    stemmer = Stemmer.Stemmer(config.stemmer) if config.stemmer else None
    stopwords = "en" if config.stopwords == "en" else []
    return Tokenizer(lower=True, stopwords=stopwords, stemmer=stemmer)


class BM25Index:
    """A bm25s index plus the exact tokenizer that built it. Positions are corpus order."""

    def __init__(self, retriever: bm25s.BM25, tokenizer: Tokenizer, config: BM25Config) -> None:
        self.retriever = retriever
        self.tokenizer = tokenizer
        self.config = config

    @classmethod
    def build(cls, texts: Iterable[str], config: BM25Config = BM25Config(),
              show_progress: bool = True) -> BM25Index:
        """Tokenise `texts` (streamed in batches, building the vocabulary) and index them;
        the token ids are held, the texts are not."""
        tokenizer = make_tokenizer(config)
        ids: list[list[int]] = []
        batch: list[str] = []
        for text in texts:
            batch.append(text)
            if len(batch) >= _TOKENIZE_BATCH:
                ids += tokenizer.tokenize(batch, update_vocab=True, show_progress=False)
                batch = []
        if batch or not ids:
            ids += tokenizer.tokenize(batch, update_vocab=True, show_progress=False)
        retriever = bm25s.BM25(method=config.method, k1=config.k1, b=config.b)
        retriever.index(Tokenized(ids=ids, vocab=tokenizer.get_vocab_dict()),
                        show_progress=show_progress)
        return cls(retriever, tokenizer, config)

    @property
    def size(self) -> int:
        return int(self.retriever.scores["num_docs"])

    def save(self, directory: Path) -> None:
        """Write the index, the tokenizer vocabulary and the settings into `directory`."""
        with atomic_directory(Path(directory)) as tmp:
            self.retriever.save(str(tmp), show_progress=False)
            self.tokenizer.save_vocab(str(tmp), VOCAB_FILE)
            self.tokenizer.save_stopwords(str(tmp), STOPWORDS_FILE)
            (tmp / SETTINGS_FILE).write_text(json.dumps(asdict(self.config), indent=2),
                                             encoding="utf-8")

    @classmethod
    def load(cls, directory: Path) -> BM25Index:
        """Read an index written by `save` (files are checked by the index manifest); its
        score arrays are memory-mapped."""
        directory = Path(directory)
        config = BM25Config(**json.loads((directory / SETTINGS_FILE).read_text("utf-8")))
        tokenizer = make_tokenizer(config)
        tokenizer.load_vocab(str(directory), VOCAB_FILE)
        tokenizer.load_stopwords(str(directory), STOPWORDS_FILE)
        retriever = bm25s.BM25.load(str(directory), load_corpus=False, mmap=True,
                                    show_progress=False)
        return cls(retriever, tokenizer, config)

    def tokenize_queries(self, queries: Sequence[str]) -> list[list[int]]:
        """Token ids of each query under the saved vocabulary; unknown words are dropped."""
        return self.tokenizer.tokenize(list(queries), update_vocab=False, return_as="ids",
                                       show_progress=False, allow_empty=False)

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every indexed text for `query` (all zeros if it has no known word)."""
        token_ids = self.tokenize_queries([query])[0]
        if not token_ids:
            return np.zeros(self.size, dtype=np.float32)
        return self.retriever.get_scores_from_ids(token_ids)

    def search_tokens(self, token_ids: Sequence[Sequence[int]],
                      k: int) -> list[list[tuple[int, float]]]:
        """Top-k (position, score) per tokenised query, best first (ties: lower position).

        Only texts sharing a word with the query (score > 0) are returned, so k larger than
        the corpus returns every matching text.
        """
        return [self._top_k(self.retriever.get_scores_from_ids(list(ids)), k) if ids else []
                for ids in token_ids]

    @staticmethod
    def _top_k(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
        # Not bm25s.retrieve's top-k: it partitions at n − k, which numpy does ~30× slower
        # than partitioning the negated scores at k when most scores tie at 0, as in BM25.
        matching = int(np.count_nonzero(scores > 0))
        k = min(k, matching)
        if k < 1:
            return []
        candidates = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(k)
        order = np.lexsort((candidates, -scores[candidates]))
        return [(int(p), float(scores[p])) for p in candidates[order]]

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]:
        """Top-k (position, score) per query; a query with no known word gets []."""
        return self.search_tokens(self.tokenize_queries(queries), k)


def question_scores(question: str, texts: Sequence[str]) -> list[float]:
    """BM25 of `question` against each of a handful of `texts`, the IDF taken over them
    (how a filter or an evaluation ranks a question's own passages lexically)."""
    index = BM25Index.build(list(texts), show_progress=False)
    return [float(score) for score in index.scores(question)]
