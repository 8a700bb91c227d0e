"""STRINC (FILCO, arXiv 2311.08377): a text is positive when it contains a gold answer.

Both sides are normalised with the evaluation's `normalize_answer` (Unicode NFKC, case
folding, punctuation and the articles a/an/the removed, white space collapsed), and an alias
matches only on whole words: "1990" does not contain the alias "199". Every alias is tried,
not only the first.
"""

from __future__ import annotations

from collections.abc import Sequence

from sieverag.inference.metrics.answer_scores import normalize_answer


def matching_alias(text: str, answers: Sequence[str]) -> str | None:
    """The first gold alias contained in `text` (after normalisation), or None."""
    haystack = f" {normalize_answer(text)} "
    for alias in answers:
        needle = normalize_answer(alias)
        if needle and f" {needle} " in haystack:
            return alias
    return None


def strinc(text: str, answers: Sequence[str]) -> bool:
    """True when `text` contains some gold alias as whole words, after normalisation."""
    return matching_alias(text, answers) is not None
