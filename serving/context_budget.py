"""The best context that fits a number of tokens: what rerank's `max_tokens_per_query` and the
proxy's context budget (`--proxy-context-tokens`, a request's `sieverag.context_tokens`) keep
of the passages the filter kept.

`fit_to_budget` takes the passages the bar kept, best first (`Candidate`: each one's text as
the context would hold it, and its kept sentences), and places them whole, in that order,
while the context still fits the budget; then as many of the next passage's kept sentences,
in document order, as still fit (joined as MCF joins key sentences, `narrowed`); then nothing
more. A sentence is never cut, and a passage the bar dropped is never a candidate, so a
budget only ever removes from what the bar kept (the bar's `min_keep` can make it keep a
passage; the budget then decides how much of it fits).

The caller says how a context is counted (`measure`, with the filter's tokenizer): rerank
counts each result's text apart, the proxy the numbered lines of the block it forwards. Every
context placed was measured, so it holds at most the budget however the tokenizer merges
text; the search for the longest one that fits assumes only that a longer context does not
hold fewer tokens, and were that ever false it would place less, never more.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from sieverag.inference.core.types import Document
from sieverag.inference.filters.mcf import narrowed


@dataclass(frozen=True)
class Candidate:
    """A passage the bar kept: its text as the context holds it whole, and its kept sentences
    (whole sentences, in document order) for when only some of them fit."""

    text: str
    sentences: tuple[str, ...]

    def part(self, count: int) -> str:
        """The first `count` of its sentences, as MCF joins key sentences."""
        keep = range(count)
        return narrowed(Document(id="", text=self.text), self.sentences, keep).text


@dataclass(frozen=True)
class Placed:
    """A passage in the context: its position among the candidates, the text it holds there,
    and how many of its sentences that is when only part of it fits (None: whole)."""

    position: int
    text: str
    sentences: int | None = None

    @property
    def trimmed(self) -> bool:
        return self.sentences is not None


# How many tokens a context (the passages placed, in order) holds.
Measure = Callable[[Sequence[Placed]], int]


def fit_to_budget(candidates: Sequence[Candidate], max_tokens: int, measure: Measure
                  ) -> list[Placed]:
    """The best context of at most `max_tokens` tokens, as `measure` counts them: the
    candidates whole, in order, while they fit, then the longest run of the next one's first
    sentences that still fits (none: it is left out), and nothing after it."""
    whole = [Placed(i, c.text) for i, c in enumerate(candidates)]
    count = _longest(len(whole), lambda n: measure(whole[:n]) <= max_tokens)
    placed = whole[:count]
    if count == len(candidates):
        return placed
    nxt = candidates[count]

    def part(n: int) -> Placed:
        return Placed(count, nxt.part(n), n)

    sentences = _longest(len(nxt.sentences),
                         lambda n: measure([*placed, part(n)]) <= max_tokens)
    return [*placed, part(sentences)] if sentences else placed


def _longest(most: int, fits: Callable[[int], bool]) -> int:
    """The largest n in 0..most with fits(n) found by bisection (fits(0) is taken as true: an
    empty context holds no tokens)."""
    low, high = 0, most
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def token_counter(tokenizer: PreTrainedTokenizerBase) -> Callable[[str], int]:
    """The tokens of a text as the filter's tokenizer counts them (no special tokens), each
    text counted once."""
    counted: dict[str, int] = {}

    def count(text: str) -> int:
        if text not in counted:
            counted[text] = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        return counted[text]

    return count


def each_text_measure(tokenizer: PreTrainedTokenizerBase) -> Measure:
    """A context counted as rerank counts it: the sum of each placed text's tokens."""
    count = token_counter(tokenizer)
    return lambda placed: sum(count(p.text) for p in placed)
