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


def _split_paragraph(paragraph: str) -> list[str]:
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(paragraph):
        if match.group().startswith(".") and not match.group().startswith(".."):
            if _is_abbreviation(paragraph[start : match.start()]):
                continue
        sentence = paragraph[start : match.end()].strip()
        if sentence:
            sentences.append(sentence)
        start = match.end()
    tail = paragraph[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def split_sentences(text: str) -> list[str]:
    """Split `text` into sentences, in order, each stripped; empty text gives []."""
    return [s for paragraph in _PARAGRAPH_BREAK.split(text) for s in _split_paragraph(paragraph)]
