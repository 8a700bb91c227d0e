"""AIC, Amber's adaptive information collector (arXiv 2504.05312): is the memory enough, and
if not, what to search for next.

* Sufficiency: one `label_logprobs` call (agent `sufficiency`) on the question and the memory;
  P(Yes) = σ(log P("Yes") − log P("No")), i.e. normalised over the two labels, and the
  memory suffices when P(Yes) ≥ `sufficiency_threshold`.
* Next query: one generation (agent `query_writer`) from the question, the memory and the
  searches made so far; the reply's first line, with a "Query:" prefix and quotes removed.
  Queries never repeat: two queries are the same when their normalised forms (lower-case
  words joined by one space) are equal. A written query that is empty or repeats an earlier
  one is replaced by a deterministic variation, the question followed by the first
  `expansion_terms` memory words that the question does not contain (stop words dropped);
  when that repeats too (or the memory adds no word), there is no new query.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from bm25s.stopwords import STOPWORDS_EN_PLUS

from sieverag.inference.errors import ConfigError
from sieverag.inference.filters.filter_format import p_relevant, relevance_log_odds
from sieverag.inference.llm.base import GenerationSettings, LLMBackend
from sieverag.inference.pipelines.memory import shown_memory
from sieverag.inference.prompt_templates import load_template
from sieverag.inference.settings import settings

YES, NO = "Yes", "No"
_WORD = re.compile(r"\w+")
_QUERY_PREFIX = re.compile(r"^\s*(new |search )?query\s*[:\-]\s*", re.IGNORECASE)
_STOP_WORDS = frozenset(STOPWORDS_EN_PLUS)


@settings
class CollectorConfig:
    """Settings of the adaptive information collector (AIC)."""

    sufficiency_threshold: float = field(default=0.5, metadata={
        "help": "the memory suffices when P(Yes) >= this (P normalised over Yes/No)"})
    query_max_new_tokens: int = field(default=32, metadata={"help": "length cap of a query"})
    expansion_terms: int = field(default=6, metadata={
        "help": "memory words added to the question when the written query repeats"})

    def __post_init__(self) -> None:
        if not 0.0 <= self.sufficiency_threshold <= 1.0:
            raise ConfigError(f"amber.collector.sufficiency_threshold must be in [0, 1], got "
                              f"{self.sufficiency_threshold}")
        if self.query_max_new_tokens < 1 or self.expansion_terms < 1:
            raise ConfigError("amber.collector.query_max_new_tokens and expansion_terms must "
                              "be >= 1")


@dataclass(frozen=True)
class Sufficiency:
    """The collector's verdict on the memory."""

    p_yes: float
    sufficient: bool

    def to_dict(self) -> dict:
        return {"p_yes": round(self.p_yes, 4), "sufficient": self.sufficient}


@dataclass(frozen=True)
class NextQuery:
    """The next search: the query (None when there is no new one), how it was made, and the
    query writer's raw reply."""

    query: str | None
    source: str  # "writer", "variation" or "none"
    written: str

    def to_dict(self) -> dict:
        return {"query": self.query, "source": self.source, "written": self.written}


def normalise_query(query: str) -> str:
    """Lower-case words joined by one space: the form in which queries may not repeat."""
    return " ".join(_WORD.findall(query.lower()))


def clean_query(reply: str) -> str:
    """The query inside a writer's reply: first non-empty line, no prefix, no quotes."""
    line = next((ln for ln in reply.splitlines() if ln.strip()), "")
    return _QUERY_PREFIX.sub("", line).strip().strip("\"'`").strip()


def expanded_query(question: str, memory: str, terms: int) -> str:
    """The question followed by the first `terms` distinct memory words it lacks (no stop
    words, no one-letter words); the question alone when the memory adds none."""
    asked = set(normalise_query(question).split())
    added: list[str] = []
    for word in _WORD.findall(memory):
        key = word.lower()
        if len(key) > 1 and key not in asked and key not in _STOP_WORDS:
            asked.add(key)
            added.append(word)
            if len(added) == terms:
                break
    return " ".join([question, *added])


class InformationCollector:
    """The AIC: sufficiency from label log-probs, then (if needed) a new, unrepeated query."""

    def __init__(self, backend: LLMBackend, config: CollectorConfig | None = None) -> None:
        self.backend = backend
        self.config = config if config is not None else CollectorConfig()
        self.sufficiency_prompt = load_template("aic_sufficiency")
        self.query_prompt = load_template("aic_query")

    def sufficiency(self, question: str, memory: str) -> Sufficiency:
        """Whether the memory suffices to answer the question."""
        prompt = self.sufficiency_prompt.messages(question=question, memory=shown_memory(memory))
        logprobs = self.backend.label_logprobs([prompt], [YES, NO], agent="sufficiency")[0]
        p_yes = p_relevant(relevance_log_odds(logprobs, YES, NO))
        return Sufficiency(p_yes, p_yes >= self.config.sufficiency_threshold)

    def next_query(self, question: str, memory: str, previous: Sequence[str]) -> NextQuery:
        """A query unlike every one in `previous` (see the module docstring)."""
        prompt = self.query_prompt.messages(
            question=question, memory=shown_memory(memory),
            queries="\n".join(f"- {q}" for q in previous))
        settings = GenerationSettings(max_new_tokens=self.config.query_max_new_tokens,
                                      stop=("\n",))
        written = self.backend.generate([prompt], settings, agent="query_writer")[0]
        seen = {normalise_query(q) for q in previous}
        query = clean_query(written)
        if normalise_query(query) and normalise_query(query) not in seen:
            return NextQuery(query, "writer", written)
        variation = expanded_query(question, memory, self.config.expansion_terms)
        if normalise_query(variation) not in seen:
            return NextQuery(variation, "variation", written)
        return NextQuery(None, "none", written)
