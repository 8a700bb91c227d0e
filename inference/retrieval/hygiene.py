"""Evidence hygiene: drop retrieved chunks that carry no usable evidence, and say why.

Presets: `off` (default: keep everything), `loose`, `strict`. (Rules on the text alone, not a
filter: in sieverag a filter is a model that reads the question.) The Auto-RAG paper found
strict cleaning can remove useful evidence, so every call returns what it removed with the reason,
for reports to show. Rules, checked in this order (the first that fires is the reason):

* `too short` — fewer than `min_words` words;
* `mostly non-alphabetic` — letters are under `min_letter_share` of the non-space characters
  (tables of numbers, symbols, OCR debris);
* `caption` — starts like "Figure 3.1", "Fig. 2", "Table 4" and has at most
  `caption_max_words` words;
* `heading` — one line of at most `heading_max_words` words with no sentence-ending
  punctuation;
* `reference list` — starts with "References"/"Bibliography"/"Works Cited", or at least
  `reference_share` of its lines (sentences, for one-line text) look like citations
  (a year in brackets, "et al.", a DOI or a URL).

`search_with_hygiene` is the one search every command goes through (`index search`, and
`eval`'s retrieval): it fetches more than k hits, walks down the ranking skipping what the
preset removes, and stops at k kept. `HygieneLog` gathers a run's removals per question.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Literal, Protocol, TypeVar, get_args

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.retrieval.rerank import HitReranker
from sieverag.inference.retrieval.retrieved import RetrievedDocument
from sieverag.inference.retrieval.sentences import split_sentences

if TYPE_CHECKING:
    from sieverag.inference.retrieval.index_folder import SearchMode
    from sieverag.inference.retrieval.search_backend import SearchBackend

HygienePreset = Literal["off", "loose", "strict"]
HYGIENE_PRESETS: tuple[str, ...] = get_args(HygienePreset)
# With hygiene on, a search fetches this many times k hits, so k usually survive it.
HYGIENE_FETCH_FACTOR = 3

_CAPTION = re.compile(r"^\s*(?:figure|fig\.|table|image|photo|chart|graph|diagram|exhibit)"
                      r"\s*\d+(?:[.\-–]\d+)*\b", re.IGNORECASE)
_REFERENCE_HEADER = re.compile(r"^\s*(?:references|bibliography|works cited|sources)\b",
                               re.IGNORECASE)
_CITATION = re.compile(r"\((?:19|20)\d{2}[a-z]?\)|\bet al\.|\bdoi\b|https?://|www\.",
                       re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?:;]['\"”’)\]]*$")


class HasText(Protocol):
    @property
    def text(self) -> str: ...


T = TypeVar("T", bound=HasText)


@dataclass(frozen=True)
class HygieneRules:
    """Thresholds of one preset (see the module docstring for each rule)."""

    min_words: int
    min_letter_share: float
    caption_max_words: int
    heading_max_words: int
    reference_share: float


PRESETS: dict[str, HygieneRules | None] = {
    "off": None,
    "loose": HygieneRules(min_words=5, min_letter_share=0.5, caption_max_words=30,
                          heading_max_words=6, reference_share=0.6),
    "strict": HygieneRules(min_words=12, min_letter_share=0.7, caption_max_words=10_000,
                           heading_max_words=12, reference_share=0.3),
}


@dataclass(frozen=True)
class Removed(Generic[T]):
    """A chunk hygiene dropped, and the rule that dropped it."""

    item: T
    reason: str


@dataclass(frozen=True)
class HygieneReport(Generic[T]):
    """What hygiene kept (input order) and what it removed (with reasons)."""

    kept: list[T]
    removed: list[Removed[T]]


def _too_short(text: str, rules: HygieneRules) -> str | None:
    words = len(text.split())
    return f"too short ({words} words)" if words < rules.min_words else None


def _non_alphabetic(text: str, rules: HygieneRules) -> str | None:
    visible = [c for c in text if not c.isspace()]
    share = sum(c.isalpha() for c in visible) / max(len(visible), 1)
    return f"mostly non-alphabetic ({share:.0%} letters)" if share < rules.min_letter_share \
        else None


def _caption(text: str, rules: HygieneRules) -> str | None:
    if _CAPTION.match(text) and len(text.split()) <= rules.caption_max_words:
        return "caption"
    return None


def _heading(text: str, rules: HygieneRules) -> str | None:
    stripped = text.strip()
    if ("\n" not in stripped and len(stripped.split()) <= rules.heading_max_words
            and not _SENTENCE_END.search(stripped)):
        return "heading"
    return None


def _reference_list(text: str, rules: HygieneRules) -> str | None:
    if _REFERENCE_HEADER.match(text):
        return "reference list"
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        lines = split_sentences(text)
    cited = sum(1 for line in lines if _CITATION.search(line))
    if lines and cited >= 2 and cited / len(lines) >= rules.reference_share:
        return "reference list"
    return None


RULES: tuple[Callable[[str, HygieneRules], str | None], ...] = (
    _too_short, _non_alphabetic, _caption, _heading, _reference_list)


def removal_reason(text: str, preset: HygienePreset) -> str | None:
    """Why `preset` would drop `text`, or None to keep it."""
    if preset not in PRESETS:
        raise ConfigError(f"hygiene preset must be one of {', '.join(HYGIENE_PRESETS)}, "
                          f"got {preset!r}")
    rules = PRESETS[preset]
    if rules is None:
        return None
    for rule in RULES:
        reason = rule(text, rules)
        if reason is not None:
            return reason
    return None


def apply_hygiene(items: Iterable[T], preset: HygienePreset = "off",
                  limit: int | None = None) -> HygieneReport[T]:
    """Split `items` (anything with `.text`) into kept and removed-with-reason, in order;
    with `limit`, stop once that many are kept (what follows is neither)."""
    kept: list[T] = []
    removed: list[Removed[T]] = []
    for item in items:
        if limit is not None and len(kept) == limit:
            break
        reason = removal_reason(item.text, preset)
        if reason is None:
            kept.append(item)
        else:
            removed.append(Removed(item, reason))
    return HygieneReport(kept, removed)


def search_with_hygiene(index: SearchBackend, query: str, k: int, mode: SearchMode,
                        preset: HygienePreset = "off", reranker: HitReranker | None = None
                        ) -> HygieneReport[RetrievedDocument]:
    """The top-k hits for `query` that `preset` keeps, best first (reranked when `reranker`
    is given), and the hits it removed on the way down to the k-th kept one (all of them
    when fewer than k were kept). With hygiene on, `HYGIENE_FETCH_FACTOR`·k hits are fetched."""
    fetch = k if preset == "off" else k * HYGIENE_FETCH_FACTOR
    return apply_hygiene(index.search(query, fetch, mode, reranker), preset, limit=k)


class HygieneLog:
    """The chunks hygiene removed from searches since the last `take`, each chunk once with
    the reason it was first removed for. Kept per thread: a run takes them after each
    question, in that question's thread, however many questions are in flight."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def _removed(self) -> dict[str, str]:
        if not hasattr(self._local, "removed"):
            self._local.removed = {}
        return self._local.removed

    def add(self, removed: Sequence[Removed[RetrievedDocument]]) -> None:
        for entry in removed:
            self._removed.setdefault(entry.item.document.id, entry.reason)

    def take(self) -> list[tuple[str, str]]:
        """(chunk id, reason) of each removal since this thread's last call, in the order
        removed."""
        taken = list(self._removed.items())
        self._local.removed = {}
        return taken
