"""Sentence splitting shared by chunking, evidence filters and trust metrics.

A small regex splitter, not a parser: a sentence ends at `.`, `!` or `?` (plus any closing
quotes or brackets) followed by white space and an upper-case letter, digit or opening quote;
a blank line always ends one. A full stop does not end a sentence after a known
abbreviation ("Dr.", "etc."), a single initial ("J.") or a dotted acronym ("U.S.", "e.g."),
and never inside a number ("3.14", no space follows). The known miss: a sentence that really
ends with an abbreviation ("... in the U.S. Then ...") stays joined to the next one.
"""

from __future__ import annotations

import re

_ABBREVIATIONS = frozenset(
    {
        "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "rev", "gen", "col", "lt",
        "sgt", "capt", "gov", "sen", "rep", "pres", "hon", "vs", "etc", "al", "cf", "fig",
        "figs", "no", "nos", "vol", "vols", "pp", "approx", "ca", "inc", "ltd", "co", "corp",
        "dept", "univ", "est", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept",
        "oct", "nov", "dec", "ed", "eds", "ch", "sec", "eq",
    }
)
# Terminal punctuation, closing quotes/brackets, then white space and a sentence start.
_BOUNDARY = re.compile(r"""[.!?]+["'”’)\]]*(?=\s+["'“‘(\[]?[A-Z0-9])""")
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_LAST_WORD = re.compile(r"(\S+)$")
_DOTTED_ACRONYM = re.compile(r"(?:[a-z]\.)+[a-z]")


def _is_abbreviation(text_before_stop: str) -> bool:
    """True when the word right before a full stop is an abbreviation, initial or acronym."""
    match = _LAST_WORD.search(text_before_stop)
    if match is None:
        return False
    word = match.group(1).lstrip("\"'“‘([").lower()
    return (
        word in _ABBREVIATIONS
        or (len(word) == 1 and word.isalpha())
        or _DOTTED_ACRONYM.fullmatch(word) is not None
    )


def _paragraph_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The sentences of the paragraph `text[start:end]`, as (start, end) offsets into `text`,
    each stripped of surrounding white space."""
    spans: list[tuple[int, int]] = []
    paragraph = text[start:end]
    begin = 0
    for match in _BOUNDARY.finditer(paragraph):
        if match.group().startswith(".") and not match.group().startswith(".."):
            if _is_abbreviation(paragraph[begin : match.start()]):
                continue
        spans.extend(_stripped(text, start + begin, start + match.end()))
        begin = match.end()
    spans.extend(_stripped(text, start + begin, end))
    return spans


def _stripped(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """`text[start:end]` without its surrounding white space, as a span; none when blank."""
    piece = text[start:end]
    if not piece.strip():
        return []
    lead = len(piece) - len(piece.lstrip())
    trail = len(piece) - len(piece.rstrip())
    return [(start + lead, end - trail)]


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Where each sentence of `split_sentences(text)` lies in `text`: (start, end) character
    offsets (Python string indices, so `text[start:end]` is the sentence), in order."""
    spans: list[tuple[int, int]] = []
    start = 0
    for paragraph_break in _PARAGRAPH_BREAK.finditer(text):
        spans.extend(_paragraph_spans(text, start, paragraph_break.start()))
        start = paragraph_break.end()
    spans.extend(_paragraph_spans(text, start, len(text)))
    return spans


def split_sentences(text: str) -> list[str]:
    """Split `text` into sentences, in order, each stripped; empty text gives []."""
    return [text[start:end] for start, end in sentence_spans(text)]
