"""Scripted agents for amber's loop: replies and label scores keyed on each agent's prompt,
over a pool of ten one- or two-sentence documents (two of them gold)."""

from __future__ import annotations

import itertools
import re

from sieverag.inference.core.types import Document, Example

POOL = tuple(
    Document(id=f"d{i}", title=f"Topic {i}",
             text=(f"Fact{i} concerns the river. It has a second sentence{i}." if i % 2 else
                   f"Fact{i} concerns the river."),
             is_gold=i in (2, 5))
    for i in range(10))
EXAMPLE = Example(id="q1", question="Which river does Fact2 concern?", answers=("the river",),
                  documents=POOL)


class Agents:
    """Scripted replies and label scores keyed on each agent's prompt, with a round counter."""

    def __init__(self, *, sufficient_when: str | None = None, keep: str = r"Fact\d",
                 query: str = "counter") -> None:
        self.sufficient_when = sufficient_when
        self.keep = re.compile(keep)
        self.query = query
        self.refines = itertools.count(1)
        self.written = itertools.count(1)

    def reply(self, text: str) -> str:
        # The memory agents are one conversation: the latest task is the one asked.
        if "Task (Refiner)" in text:
            return f"Notes after update {next(self.refines)}."
        if "Task (Challenger)" in text:
            return "Nothing is missing."
        if "Task (Reviewer)" in text:
            return "The evidence is relevant."
        if "Task (Collector)" in text:
            return (f"Query: search number {next(self.written)}" if self.query == "counter"
                    else self.query)
        if text.startswith("Question:") and "Sentences:" in text:
            return "1"
        return "the river"

    def labels(self, text: str) -> dict[str, float]:
        if "Task (Collector)" in text:
            enough = self.sufficient_when is not None and self.sufficient_when in text
            return {"Yes": 0.0 if enough else -5.0, "No": -5.0 if enough else 0.0}
        if "Text:" in text:  # the filter's chunk prompt
            chunk = text.split("Text:", 1)[1]
            return {"Yes": 0.0 if self.keep.search(chunk) else -5.0, "No": -1.0}
        return {"Yes": -1.0, "No": -1.0}
