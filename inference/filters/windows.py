"""A document longer than the filter reads, read window by window and judged by its best window.

The trained filter read passages of a bounded length (its card's figure, `card_window_tokens`):
a document longer than that budget is split into windows on sentence boundaries, each at most
`window_tokens` tokens of text (a sentence longer than the budget is cut at token boundaries
into pieces that fit). The filter reads at most `max_windows` of them: those retrieval ranks
best for the question (BM25 over the document's windows picks a shortlist of twice that many,
so the dense encoder reads a bounded number of them however long the document; BM25 + dense,
z-scored over the shortlist, as `combination.PRIORS_ONLY` fuses them, picks the ones read).
The document is then judged by its best read window (the one the filter scores highest, ties
to the earlier): MCF's verdict, its P(relevant) and its sentence stage are those of that
window, judged in the round as if it had been sent alone (`WindowedRound`), and the window's
character offsets in the document (`details["window"]`) map its sentences back.

A document that fits is read whole, as it was sent. A blank document (empty, or white space
only) is not read: P(relevant) 0, never kept. MCF (`MultiGranularFilter.chunk_stage`) reads
every round this way, so the rerank and score endpoints, the filtering proxy and every
pipeline judge long documents alike; the server counts a request's filter tokens from the
same windows (`Window.tokens`) before any work.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sieverag.inference.core.types import Document
from sieverag.inference.filters.document_filter import FilterResult, ScoredDocument, z_scores
from sieverag.inference.retrieval.sentences import sentence_spans

# The shipped filter's training max_length: the window of a filter whose card gives no figure.
DEFAULT_WINDOW_TOKENS = 256
DEFAULT_MAX_WINDOWS = 4
# The card's record of the filter's training records' lengths (written by `sieverag train`).
RECORD_TOKENS_KEY = "record_tokens"
# A backend without a tokenizer (a served filter read through the OpenAI API) counts these
# pieces: a word or one punctuation mark, about one token each in English.
_WORD_PIECE = re.compile(r"\w+|[^\w\s]")

# text -> (start, end) character offsets of each of its tokens, in order.
TokenOffsets = Callable[[str], tuple[tuple[int, ...], tuple[int, ...]]]
# question, texts, embedding model -> (BM25, dense cosine) of each text.
PriorScorer = Callable[[str, Sequence[str], str], tuple[Sequence[float], Sequence[float]]]


def card_window_tokens(card: Mapping[str, Any] | None) -> int:
    """The tokens of text a window holds for the filter of `card`: the longest record it was
    trained on (`dataset.record_tokens.max`, prompt and answer: its passages were shorter),
    else the recipe's max_length (cards written before training recorded the lengths: no
    record was longer), else `DEFAULT_WINDOW_TOKENS`."""
    card = card or {}
    recorded = ((card.get("dataset") or {}).get(RECORD_TOKENS_KEY) or {}).get("max")
    if recorded is None:
        recorded = ((card.get("recipe") or {}).get("training") or {}).get("max_length")
    return int(recorded) if isinstance(recorded, int) and recorded > 0 else DEFAULT_WINDOW_TOKENS


def token_offsets_of(backend: object) -> TokenOffsets:
    """How the filter behind `backend` counts tokens: its tokenizer's offsets where it has a
    fast tokenizer, else word pieces (`_WORD_PIECE`)."""
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None or not getattr(tokenizer, "is_fast", False):
        return word_piece_offsets
    return functools.partial(_tokenizer_offsets, tokenizer)


def word_piece_offsets(text: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Where each word or punctuation mark of `text` starts and ends."""
    pieces = [match.span() for match in _WORD_PIECE.finditer(text)]
    return tuple(s for s, _ in pieces), tuple(e for _, e in pieces)


@functools.lru_cache(maxsize=256)  # the server counts a request's windows, then MCF reads them
def _tokenizer_offsets(tokenizer: Any, text: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    spans = tokenizer(text, add_special_tokens=False,
                      return_offsets_mapping=True)["offset_mapping"]
    return tuple(s for s, _ in spans), tuple(e for _, e in spans)


@dataclass(frozen=True)
class Window:
    """A run of whole sentences (or pieces of one sentence too long for a window) of a
    document: `units` their (start, end) character offsets in it, `tokens` their tokens."""

    units: tuple[tuple[int, int], ...]
    tokens: int

    @property
    def start(self) -> int:
        return self.units[0][0]

    @property
    def end(self) -> int:
        return self.units[-1][1]


@dataclass(frozen=True)
class WindowRule:
    """How a filter reads documents: windows of at most `window_tokens` tokens of text (a
    document that fits is one window), at most `max_windows` of them read, tokens counted by
    `offsets`."""

    window_tokens: int
    max_windows: int
    offsets: TokenOffsets = word_piece_offsets

    def fits(self, text: str) -> bool:
        """Whether `text` is read whole: at most `window_tokens` tokens (a text of no more
        bytes than that, without counting: a token holds at least a byte)."""
        return (len(text.encode()) <= self.window_tokens
                or len(self.offsets(text)[0]) <= self.window_tokens)

    def units(self, text: str) -> list[tuple[int, int, int]]:
        """The sentences of `text` (`sentence_spans`) as (start, end, tokens), each longer
        than a window cut at token boundaries into pieces that fit."""
        starts, ends = self.offsets(text)
        units = []
        for start, end in sentence_spans(text):
            first, last = bisect.bisect_right(ends, start), bisect.bisect_left(starts, end)
            if last - first <= self.window_tokens:
                units.append((start, end, last - first))
                continue
            for at in range(first, last, self.window_tokens):
                upto = min(at + self.window_tokens, last)
                units.extend((s, e, upto - at) for s, e in
                             _stripped(text, max(start, starts[at]), min(end, ends[upto - 1])))
        return units

    def windows(self, text: str) -> list[Window]:
        """`text` as windows of consecutive units, each at most `window_tokens` tokens (one
        window: the whole text, when it fits)."""
        if self.fits(text):
            return [Window(((0, len(text)),), len(self.offsets(text)[0]))] if text.strip() else []
        windows: list[Window] = []
        units: list[tuple[int, int]] = []
        tokens = 0
        for start, end, count in self.units(text):
            if units and tokens + count > self.window_tokens:
                windows.append(Window(tuple(units), tokens))
                units, tokens = [], 0
            units.append((start, end))
            tokens += count
        if units:
            windows.append(Window(tuple(units), tokens))
        return windows

    def cut(self, text: str, keep: str = "start") -> str:
        """`text` cut to its first (`keep` "start") or last `window_tokens` tokens."""
        starts, ends = self.offsets(text)
        if len(starts) <= self.window_tokens:
            return text
        if keep == "end":
            return text[starts[len(starts) - self.window_tokens]:]
        return text[:ends[self.window_tokens - 1]]


def window_document(document: Document, window: Window) -> Document:
    """The window as MCF reads it: the document's text between the window's ends, its units
    as the sentences (the data's own split and gold sentence marks do not carry over)."""
    text = document.text
    return replace(document, text=text[window.start:window.end],
                   sentences=tuple(text[s:e] for s, e in window.units), supporting_sentences=None)


def windows_read(question: str, texts: Sequence[str], max_windows: int, priors: PriorScorer,
                 embedding_model: str) -> list[int]:
    """Which of a document's windows (`texts`) the filter reads, in document order: all when
    they are at most `max_windows`; else BM25's 2·max_windows best, of which the max_windows
    that z(BM25) + z(dense) over them ranks best (ties to the earlier)."""
    if len(texts) <= max_windows:
        return list(range(len(texts)))
    shortlist = list(range(len(texts)))
    if len(texts) > 2 * max_windows:
        from sieverag.inference.retrieval.bm25 import question_scores

        lexical = question_scores(question, texts)
        shortlist = sorted(sorted(shortlist, key=lambda i: -lexical[i])[:2 * max_windows])
    bm25, dense = priors(question, [texts[i] for i in shortlist], embedding_model)
    fused = [b + d for b, d in zip(z_scores(list(bm25)), z_scores(list(dense)), strict=True)]
    best = sorted(range(len(shortlist)), key=lambda j: -fused[j])[:max_windows]
    return sorted(shortlist[j] for j in best)


@dataclass(frozen=True)
class WindowedRound:
    """One round's documents as the filter reads them: for each, the windows read (the
    document itself where it fits; none where it is blank), and where they lie in it."""

    documents: tuple[Document, ...]
    reads: tuple[tuple[Document, ...], ...]
    places: tuple[tuple[Window, ...], ...]
    counts: tuple[int, ...]

    @classmethod
    def of(cls, question: str, documents: Sequence[Document], rule: WindowRule,
           priors: PriorScorer, embedding_model: str) -> WindowedRound:
        reads, places, counts = [], [], []
        for document in documents:
            windows = rule.windows(document.text)
            if len(windows) <= 1:  # blank (none) or read whole, as sent
                reads.append((document,) if windows else ())
                places.append(())
                counts.append(len(windows))
                continue
            texts = [document.text[w.start:w.end] for w in windows]
            chosen = [windows[i] for i in windows_read(question, texts, rule.max_windows,
                                                       priors, embedding_model)]
            reads.append(tuple(window_document(document, w) for w in chosen))
            places.append(tuple(chosen))
            counts.append(len(windows))
        return cls(tuple(documents), tuple(reads), tuple(places), tuple(counts))

    @property
    def read(self) -> list[Document]:
        """Every window the filter reads, document after document."""
        return [window for windows in self.reads for window in windows]

    def prior_scores(self, question: str, priors: PriorScorer, embedding_model: str
                     ) -> list[dict]:
        """Scores of `read` in its order where the filter does not read them
        (`Combination.reads_filter`): a windowed document's windows by z(BM25) + z(dense) over
        them (as `windows_read` ranks them), a document read whole 0; no P(Yes) (None)."""
        scores: list[dict] = []
        for windows in self.reads:
            if len(windows) <= 1:
                scores.extend({"score": 0.0, "p_yes": None} for _ in windows)
                continue
            bm25, dense = priors(question, [w.text for w in windows], embedding_model)
            scores.extend({"score": b + d, "p_yes": None} for b, d in
                          zip(z_scores(list(bm25)), z_scores(list(dense)), strict=True))
        return scores

    def best(self, scores: Sequence[dict]) -> list[BestWindow]:
        """Each read document's best window, from `scores`, the filter's scores of `read` in
        its order: the one scored highest (ties to the earlier)."""
        chosen, at = [], 0
        for index, windows in enumerate(self.reads):
            if windows:
                mine = scores[at:at + len(windows)]
                top = max(range(len(windows)), key=lambda j: (mine[j]["score"], -j))
                chosen.append(BestWindow(index, windows[top], mine[top], top))
            at += len(windows)
        return chosen

    def result(self, best: Sequence[BestWindow], verdicts: FilterResult) -> FilterResult:
        """MCF's verdicts on the best windows (`verdicts`, in `best`'s order) as one per
        document, in order (the kept ones in `verdicts`' order): a windowed document's
        carries where its window lies, how many windows it has and how many the filter read;
        a blank one scores 0 and is not kept."""
        judged: dict[int, ScoredDocument] = {}
        renamed: dict[int, ScoredDocument] = {}
        for chosen, scored in zip(best, verdicts.scored, strict=True):
            places = self.places[chosen.index]
            new = scored
            if places:
                window = places[chosen.position]
                new = replace(scored, details={
                    **scored.details, "window": [window.start, window.end],
                    "windows": self.counts[chosen.index], "windows_read": len(places)})
            judged[chosen.index] = renamed[id(scored)] = new
        scored = tuple(judged.get(i) or ScoredDocument(d, 0.0, False, {
            "p_relevant": 0.0, "windows": 0, "windows_read": 0})
            for i, d in enumerate(self.documents))
        return replace(verdicts, kept=tuple(renamed[id(s)] for s in verdicts.kept),
                       scored=scored)


@dataclass(frozen=True)
class BestWindow:
    """A document's best read window: the document's `index` in the round, the window as
    MCF reads it, the filter's `scores` of it, and its `position` among the windows read."""

    index: int
    document: Document
    scores: dict
    position: int


def _stripped(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """`text[start:end]` without its surrounding white space, as a span; none when blank."""
    piece = text[start:end]
    if not piece.strip():
        return []
    return [(start + len(piece) - len(piece.lstrip()), end - len(piece) + len(piece.rstrip()))]
