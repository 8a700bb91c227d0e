"""Answer extraction: turn a generator's reply into the short answer that is scored.

Small models answer in sentences ("The capital of France is Paris."), which makes exact
match meaningless. The extraction applied before scoring (the raw reply is always kept):

* `none` — the reply, stripped;
* `first_line` — its first non-empty line, with an "Answer:" prefix and surrounding quotes
  and trailing punctuation removed;
* `first_sentence` (default) — as `first_line`, then cut at the first sentence end, and a
  restated question at the start removed (e.g. "Q? A" → "A").
"""

from __future__ import annotations

import re
from typing import Literal

AnswerExtraction = Literal["none", "first_line", "first_sentence"]
ANSWER_EXTRACTIONS: tuple[str, ...] = ("none", "first_line", "first_sentence")

_PREFIX = re.compile(r"^\s*(final answer|short answer|answer)\s*[:\-]\s*", re.IGNORECASE)
# A sentence ends at . ! ? followed by a space and a capital letter or digit; "U.S." survives.
_SENTENCE_END = re.compile(r"(?<![A-Z])(?<!\b[A-Z][a-z])[.!?](?=\s+[A-Z0-9\"'(])")
_EDGE = " \t\"'`*.,;:!"


def extract_answer(
    reply: str, question: str = "", mode: AnswerExtraction = "first_sentence"
) -> str:
    """The short answer inside `reply` (see the module docstring for each mode)."""
    text = reply.strip()
    if mode == "none":
        return text
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = _PREFIX.sub("", line.strip())
    if mode == "first_sentence":
        line = _strip_restated_question(line, question)
        match = _SENTENCE_END.search(line)
        if match:
            line = line[: match.start()]
    return line.strip(_EDGE)


def _strip_restated_question(answer: str, question: str) -> str:
    question = question.strip()
    if question and answer.lower().startswith(question.lower()):
        rest = answer[len(question):].strip(" :-")
        return rest or answer
    return answer
