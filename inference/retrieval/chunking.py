"""Chunking: cut source documents into the passages an index holds.

Strategies (a registry, chosen by `ChunkingConfig.strategy`):

* `tokens` — windows of `size` words (white-space tokens) that overlap by `overlap` words;
  a chunk keeps the source text's own spacing between its first and last word;
* `sentences` — `size` sentences per chunk (see `sentences.split_sentences`), overlapping
  by `overlap` sentences;
* `none` — each document is one chunk.

A chunk id is `<source id>#<position>`: stable across runs and machines for the same
corpus and settings, and the source id is recoverable from it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import at_least, settings
from sieverag.inference.core.types import Document
from sieverag.inference.retrieval.sentences import split_sentences

ChunkStrategy = Literal["tokens", "sentences", "none"]
CHUNK_STRATEGIES: tuple[str, ...] = get_args(ChunkStrategy)
# (size, overlap) used when the config leaves them unset, per strategy.
DEFAULT_WINDOW: dict[str, tuple[int, int]] = {"tokens": (200, 40), "sentences": (5, 1),
                                              "none": (0, 0)}
_WORD = re.compile(r"\S+")


@settings
class ChunkingConfig:
    """How to cut documents into chunks; `size`/`overlap` count words or sentences."""

    strategy: ChunkStrategy = field(
        default="tokens", metadata={"help": "tokens (word windows), sentences, or none"})
    size: int | None = field(
        default=None, metadata={"help": "words (tokens) or sentences per chunk; "
                                        "default 200 words / 5 sentences"})
    overlap: int | None = field(
        default=None, metadata={"help": "words or sentences shared by consecutive chunks; "
                                        "default 40 words / 1 sentence"})

    def __post_init__(self) -> None:
        default_size, default_overlap = DEFAULT_WINDOW[self.strategy]
        if self.size is None:
            object.__setattr__(self, "size", default_size)
        if self.overlap is None:
            object.__setattr__(self, "overlap", min(default_overlap, max(self.size - 1, 0)))
        if self.strategy != "none":
            at_least(1, "chunking.", size=self.size)
            if not 0 <= self.overlap < self.size:
                raise ConfigError(f"chunking.overlap must be in [0, size={self.size}), "
                                  f"got {self.overlap}")


@dataclass(frozen=True)
class Chunk:
    """One indexed passage: `position` is its order within the source document."""

    id: str
    source_id: str
    position: int
    text: str
    title: str = ""

    def to_document(self) -> Document:
        return Document(id=self.id, text=self.text, title=self.title)


def chunk_id(source_id: str, position: int) -> str:
    """The stable id of the `position`-th chunk of source `source_id`."""
    return f"{source_id}#{position}"


def source_id_of(chunk_identifier: str) -> str:
    """The source document id a chunk id was derived from."""
    return chunk_identifier.rsplit("#", 1)[0]


def _windows(count: int, size: int, overlap: int) -> Iterable[tuple[int, int]]:
    """[start, end) index windows over `count` items; the last one reaches the end."""
    step = size - overlap
    start = 0
    while True:
        end = min(start + size, count)
        yield start, end
        if end >= count:
            return
        start += step


def split_token_windows(text: str, size: int, overlap: int) -> list[str]:
    """Windows of `size` words overlapping by `overlap`, each a slice of `text`."""
    spans = [m.span() for m in _WORD.finditer(text)]
    if not spans:
        return []
    return [text[spans[s][0] : spans[e - 1][1]] for s, e in _windows(len(spans), size, overlap)]


def split_sentence_windows(text: str, size: int, overlap: int) -> list[str]:
    """Groups of `size` sentences overlapping by `overlap`, joined by a space."""
    sentences = split_sentences(text)
    if not sentences:
        return []
    return [" ".join(sentences[s:e]) for s, e in _windows(len(sentences), size, overlap)]


def _whole_text(text: str, size: int, overlap: int) -> list[str]:
    return [text.strip()] if text.strip() else []


CHUNKERS: dict[str, Callable[[str, int, int], list[str]]] = {
    "tokens": split_token_windows,
    "sentences": split_sentence_windows,
    "none": _whole_text,
}


def chunk_document(document: Document, config: ChunkingConfig) -> list[Chunk]:
    """The chunks of one document, in order."""
    texts = CHUNKERS[config.strategy](document.text, config.size or 0, config.overlap or 0)
    return [Chunk(id=chunk_id(document.id, i), source_id=document.id, position=i, text=t,
                  title=document.title) for i, t in enumerate(texts)]


def iter_chunks(documents: Iterable[Document], config: ChunkingConfig) -> Iterator[Chunk]:
    """The chunks of every document, in corpus order, one at a time."""
    for document in documents:
        yield from chunk_document(document, config)


def chunk_corpus(documents: Sequence[Document], config: ChunkingConfig) -> list[Chunk]:
    """The chunks of every document, in corpus order."""
    return list(iter_chunks(documents, config))
