"""Which BM25 engine serves an index: choose it (`BM25Config.engine`), build it, load it.

* `bm25s` keeps its score matrix in memory while building (about 5 GB at a million
  passages) and is the faster of the two on small corpora;
* `tantivy` builds within `bm25.heap_mb` and opens memory-mapped, for large corpora.

`auto` takes bm25s below `TANTIVY_FROM_DOCUMENTS` source documents and tantivy from there.
The engine an index was built with is recorded in its `bm25/settings.json`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from sieverag.inference.retrieval import bm25 as bm25s_files
from sieverag.inference.retrieval import tantivy_bm25
from sieverag.inference.retrieval.bm25 import SETTINGS_FILE, BM25Config, BM25Index
from sieverag.inference.retrieval.tantivy_bm25 import TantivyBM25Index, check_tantivy_config

# Where `auto` switches to tantivy: bm25s's build peaks near 1 GB at 200k passages and
# grows linearly (issue 63's measurements), tantivy's stays within its heap.
TANTIVY_FROM_DOCUMENTS = 200_000


class LexicalIndex(Protocol):
    """What the index facade asks of a BM25 engine."""

    @property
    def size(self) -> int: ...

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[int, float]]]: ...


def choose_engine(config: BM25Config, documents: int) -> str:
    """The concrete engine for a corpus of `documents` source documents; a tantivy choice
    whose settings tantivy cannot honour is refused here, before anything is written."""
    engine = config.engine
    if engine == "auto":
        engine = "tantivy" if documents >= TANTIVY_FROM_DOCUMENTS else "bm25s"
    if engine == "tantivy":
        check_tantivy_config(config)
    return engine


def build_lexical(texts: Iterable[str], directory: Path, config: BM25Config, engine: str,
                  *, total: int | None = None,
                  show_progress: bool = True) -> tuple[LexicalIndex, list[str]]:
    """Build the engine's index of `texts` into `directory`; returns it and its files
    (relative to `directory`)."""
    concrete = replace(config, engine=engine)  # type: ignore[arg-type]
    if engine == "tantivy":
        index = TantivyBM25Index.build(texts, directory, concrete, total=total,
                                       heap_mb=config.heap_mb, show_progress=show_progress)
        return index, list(tantivy_bm25.FILES)
    bm25 = BM25Index.build(texts, concrete, show_progress=show_progress)
    bm25.save(directory)
    return bm25, list(bm25s_files.FILES)


def load_lexical(directory: Path) -> LexicalIndex:
    """Open a BM25 folder with the engine that built it (no engine recorded: bm25s)."""
    directory = Path(directory)
    recorded = json.loads((directory / SETTINGS_FILE).read_text("utf-8")).get("engine")
    if recorded == "tantivy":
        return TantivyBM25Index.load(directory)
    return BM25Index.load(directory)
