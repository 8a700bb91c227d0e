"""Documents round by round, for the pipelines that search more than once (amber, Iter-RetGen):
each round's query gets the top k documents no earlier round saw."""

from __future__ import annotations

from sieverag.inference.core.types import Document, Example
from sieverag.inference.data.gold_match import mark_gold
from sieverag.inference.pipelines.pipeline_registry import PipelineContext
from sieverag.inference.retrieval.bm25 import BM25Index


class RoundDocuments:
    """Unseen documents for a query: from the index search, or the BM25-ranked given pool."""

    def __init__(self, context: PipelineContext, example: Example, k: int) -> None:
        self.context = context
        self.example = example
        self.k = k
        self.seen: set[str] = set()
        self._pool: list[Document] | None = None
        self._bm25: BM25Index | None = None

    def ranked(self, query: str) -> list[Document]:
        """Documents for `query`, best first: the index's top k + seen, or the whole ranked
        given pool."""
        if self.context.search is not None:
            return list(mark_gold(self.example,
                                  self.context.search(query, self.k + len(self.seen))))
        if self._pool is None:
            self._pool = list(self.context.documents(self.example))
            if self._pool:
                self._bm25 = BM25Index.build([d.as_context() for d in self._pool],
                                             show_progress=False)
        if self._bm25 is None:
            return []
        scores = self._bm25.scores(query)
        order = sorted(range(len(self._pool)), key=lambda i: (-scores[i], i))
        return [self._pool[i] for i in order]

    @property
    def exhausted(self) -> bool:
        """The question's given pool has no unseen document left (never with an index)."""
        return (self.context.search is None and self._pool is not None
                and {d.id for d in self._pool} <= self.seen)

    def fetch(self, query: str) -> tuple[list[Document], int]:
        """The top-k unseen documents for `query` (now seen), and how many seen ones ranked
        above the last of them were skipped."""
        fresh: list[Document] = []
        skipped = 0
        for document in self.ranked(query):
            if len(fresh) == self.k:
                break
            if document.id in self.seen:
                skipped += 1
            else:
                fresh.append(document)
        self.seen.update(d.id for d in fresh)
        return fresh, skipped
