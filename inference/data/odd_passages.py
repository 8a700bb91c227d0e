"""The odd passages of a question set, counted and said in one summary line.

A passage is odd when it is *empty* (no text), *blank* (white space only), a *duplicate*
(the same title and text as an earlier passage of its question) or, where the command reads
passages through a window, *long* (its text does not fit that window). Every command that
reads a QA dataset's passages (`eval`, `eval-filter`, `label`, `hard-negatives`,
`filter fit-combination`) prints the line `odd_passages_line` renders, with its own
`PassageHandling`: what it does with each kind, as its code does it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sieverag.inference.core.types import Example


@dataclass(frozen=True)
class PassageHandling:
    """What a command does with odd passages, one phrase per kind (`blank` covers empty and
    blank ones), and where it has one, the window a passage's text must fit (`fits`, named
    by `window`) and what it does with one that does not (`long`)."""

    blank: str
    duplicate: str
    long: str = ""
    window: str = ""
    fits: Callable[[str], bool] | None = None

    def __post_init__(self) -> None:
        if not self.blank or not self.duplicate:
            raise ValueError("PassageHandling needs a `blank` and a `duplicate` phrase")
        if self.fits is not None and not (self.long and self.window):
            raise ValueError("PassageHandling with `fits` needs a `long` and a `window` phrase")


def odd_passages_line(examples: Iterable[Example], handling: PassageHandling) -> str | None:
    """One line counting the odd passages of `examples` (see the module docstring) and saying
    what `handling` does with each kind, e.g. `passages: 4 odd of 14, in 1 of 3 questions: 1
    empty and 1 blank (white space only) not read (P(relevant) 0); 1 duplicate scored again;
    1 longer than the filter's window of 256 tokens read in windows`; None when none is odd.
    A passage both duplicated and long counts once in the total and under each kind."""
    empty = blank = duplicate = long = odd = total = questions = with_odd = 0
    for example in examples:
        questions += 1
        seen: set[tuple[str, str]] = set()
        odd_before = odd
        for document in example.documents:
            total += 1
            if not document.text.strip():
                empty += not document.text
                blank += bool(document.text)
                odd += 1
                continue
            key = (document.title, document.text)
            repeated = key in seen
            seen.add(key)
            over = handling.fits is not None and not handling.fits(document.text)
            duplicate += repeated
            long += over
            odd += repeated or over
        with_odd += odd > odd_before
    if not odd:
        return None
    unread = " and ".join(part for part in (empty and f"{empty} empty",
                                            blank and f"{blank} blank (white space only)")
                          if part)
    parts = [f"{unread} {handling.blank}" if unread else "",
             f"{duplicate} duplicate{'s' if duplicate > 1 else ''} {handling.duplicate}"
             if duplicate else "",
             f"{long} longer than {handling.window} {handling.long}" if long else ""]
    return (f"passages: {odd} odd of {total}, in {with_odd} of {questions} "
            f"question{'s' if questions > 1 else ''}: " + "; ".join(p for p in parts if p))
