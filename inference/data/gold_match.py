"""Which given passage a retrieved chunk comes from, so gold marks survive an index.

An index names its chunks by its own ids (`<source id>#<n>`), not by the dataset's passage
ids, so over an index nothing says which chunk is a question's gold passage. A chunk comes
from a given passage when its text, with whitespace collapsed and case folded, lies inside
the passage's text (a passage split into several chunks) or holds it whole, and their titles
do not contradict each other (equal, or one of them untitled). A piece shorter than 40
characters matches only an equal text.

`mark_gold` gives retrieved chunks the mark of the passage they come from; a chunk from no
given passage is not gold when the question's passages carry marks (HotpotQA's gold pair,
NQ's `isgold`), and stays unmarked (None) when they carry none. `read_passage_ids` maps what
a pipeline read to the given passages' ids, so read precision/recall count over an index
exactly as over the given passages.

Known gap: the HotpotQA corpus keeps the first text of a title seen in several questions
(8 of 3,904 titles in the shared file differ); a chunk of such a title matches only the
question whose text was kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sieverag.inference.core.types import Document, Example


def _normalized(text: str) -> str:
    return " ".join(text.split()).casefold()


# A piece shorter than this matches only a whole, equal text: a stray "1990." would otherwise
# lie inside many passages.
MIN_CONTAINED_CHARS = 40


def _contains(whole: str, piece: str) -> bool:
    return whole == piece or (len(piece) >= MIN_CONTAINED_CHARS and piece in whole)


class PassageMatcher:
    """Match documents to one question's given passages (see the module docstring)."""

    def __init__(self, passages: Sequence[Document]) -> None:
        self._passages = [(p, _normalized(p.title), _normalized(p.text)) for p in passages]
        self.marked = any(p.is_gold is not None for p in passages)

    def source(self, document: Document) -> Document | None:
        """The given passage `document` comes from (itself if it is one), or None."""
        title, text = _normalized(document.title), _normalized(document.text)
        if not text:
            return None
        for passage, passage_title, passage_text in self._passages:
            if passage.id == document.id and passage.text == document.text:
                return passage
            if title and passage_title and title != passage_title:
                continue
            if _contains(passage_text, text) or _contains(text, passage_text):
                return passage
        return None

    def mark(self, documents: Sequence[Document]) -> tuple[Document, ...]:
        """`documents` with the gold mark of their source passage (see `mark_gold`)."""
        if not self.marked:
            return tuple(documents)
        marked = []
        for document in documents:
            if document.is_gold is None:
                source = self.source(document)
                document = replace(document, is_gold=bool(source is not None and source.is_gold))
            marked.append(document)
        return tuple(marked)


def mark_gold(example: Example, documents: Sequence[Document]) -> tuple[Document, ...]:
    """Retrieved `documents` marked gold or not from `example`'s given passages.

    Documents that already carry a mark keep it; where the example's passages carry no mark
    the documents are returned unchanged."""
    return PassageMatcher(example.documents).mark(documents)


def read_passage_ids(example: Example, documents: Sequence[Document]) -> list[str]:
    """The ids of the given passages `documents` come from; a document from none keeps its
    own id (so it counts as read and not gold)."""
    matcher = PassageMatcher(example.documents)
    ids = []
    for document in documents:
        source = matcher.source(document)
        ids.append(source.id if source is not None else document.id)
    return ids
