"""AIC, Amber's adaptive information collector (arXiv 2504.05312): is the memory enough, and
if not, what to search for next.

* Sufficiency: one `label_logprobs` call (agent `sufficiency`) on the question and the memory;
  P(Yes) = σ(log P("Yes") − log P("No")), i.e. normalised over the two labels, and the
  memory suffices when P(Yes) ≥ `sufficiency_threshold`.
* Next query, `query_source: write` (the paper's): one generation (agent `query_writer`)
  from the question, the memory and the searches made so far; the reply's first line, with a
  "Query:" prefix and quotes removed.
* Next query, `query_source: bridge` (for small models, which write poor queries, e.g.
  "[1] Ernest Hemingway"): candidates are read off the kept evidence — the titles of kept
  chunks, then capitalised name spans in their text — that the question does not already
  name (the bridge entity of a multi-hop question is such a name); at most
  `max_candidates`, in that order. One `label_logprobs` batch (agent `bridge_scorer`) asks,
  per candidate, whether a search about it would find what the memory lacks; the candidate
  with the highest P(Yes) wins, and the query is the candidate followed by the question.
  Every candidate's P(Yes) is kept for the trace. With no fresh candidate the writer runs.
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
from typing import Literal

from bm25s.stopwords import STOPWORDS_EN_PLUS

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.prompt_templates import load_template
from sieverag.inference.core.settings import settings
from sieverag.inference.core.types import Document
from sieverag.inference.filters.filter_format import p_relevant, relevance_log_odds
from sieverag.inference.llm.backend_protocol import GenerationSettings, LLMBackend
from sieverag.inference.pipelines.amber.memory import shown_memory

YES, NO = "Yes", "No"
_WORD = re.compile(r"\w+")
_QUERY_PREFIX = re.compile(r"^\s*(new |search )?query\s*[:\-]\s*", re.IGNORECASE)
_STOP_WORDS = frozenset(STOPWORDS_EN_PLUS)
# A capitalised name: one or more capitalised words, joined by a few lower-case particles
# ("Bank of England", "Ludwig van Beethoven").
_NAME = re.compile(r"[A-Z][\w'’-]*(?:\s+(?:(?:of|the|de|van|von|da|del|la|and)\s+)?"
                   r"[A-Z][\w'’-]*)*")
QuerySource = Literal["write", "bridge"]


@settings
class CollectorConfig:
    """Settings of the adaptive information collector (AIC)."""

    sufficiency_threshold: float = field(default=0.5, metadata={
        "help": "the memory suffices when P(Yes) >= this (P normalised over Yes/No)"})
    query_max_new_tokens: int = field(default=32, metadata={"help": "length cap of a query"})
    expansion_terms: int = field(default=6, metadata={
        "help": "memory words added to the question when the written query repeats"})
    query_source: QuerySource = field(default="write", metadata={
        "help": "write: the model writes the next query (the paper's AIC); bridge: the model "
                "scores candidate names read off the kept evidence and the best one leads "
                "the query"})
    max_candidates: int = field(default=8, metadata={
        "help": "bridge candidates scored per round at most"})

    def __post_init__(self) -> None:
        if not 0.0 <= self.sufficiency_threshold <= 1.0:
            raise ConfigError(f"amber.collector.sufficiency_threshold must be in [0, 1], got "
                              f"{self.sufficiency_threshold}")
        if min(self.query_max_new_tokens, self.expansion_terms, self.max_candidates) < 1:
            raise ConfigError("amber.collector.query_max_new_tokens, expansion_terms and "
                              "max_candidates must be >= 1")


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
    source: str  # "bridge", "writer", "variation" or "none"
    written: str
    candidates: tuple[tuple[str, float], ...] = ()  # bridge: (candidate, P(Yes)), in order

    def to_dict(self) -> dict:
        return {"query": self.query, "source": self.source, "written": self.written,
                "candidates": [{"name": name, "p_yes": round(p, 4)}
                               for name, p in self.candidates]}


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


def _named_in(name: str, asked: set[str]) -> bool:
    """Whether every content word of `name` is among the question's words."""
    words = [w for w in normalise_query(name).split() if w not in _STOP_WORDS]
    return not words or all(w in asked for w in words)


def bridge_candidates(question: str, evidence: Sequence[Document], limit: int) -> list[str]:
    """Names in the kept evidence that the question does not name: the kept chunks' titles
    first, then capitalised spans of their text, in order, without repeats, at most
    `limit`."""
    asked = set(normalise_query(question).split())
    found: dict[str, str] = {}
    names = [d.title for d in evidence if d.title]
    names += [m.group(0) for d in evidence for m in _NAME.finditer(d.text)]
    for name in names:
        key = normalise_query(name)
        if key and key not in found and not _named_in(name, asked):
            found[key] = name
            if len(found) == limit:
                break
    return list(found.values())


class InformationCollector:
    """The AIC: sufficiency from label log-probs, then (if needed) a new, unrepeated query."""

    def __init__(self, backend: LLMBackend, config: CollectorConfig | None = None) -> None:
        self.backend = backend
        self.config = config if config is not None else CollectorConfig()
        self.sufficiency_prompt = load_template("aic_sufficiency")
        self.query_prompt = load_template("aic_query")
        self.bridge_prompt = load_template("aic_bridge")

    def sufficiency(self, question: str, memory: str) -> Sufficiency:
        """Whether the memory suffices to answer the question."""
        prompt = self.sufficiency_prompt.messages(question=question, memory=shown_memory(memory))
        logprobs = self.backend.label_logprobs([prompt], [YES, NO], agent="sufficiency")[0]
        p_yes = p_relevant(relevance_log_odds(logprobs, YES, NO))
        return Sufficiency(p_yes, p_yes >= self.config.sufficiency_threshold)

    def next_query(self, question: str, memory: str, previous: Sequence[str],
                   evidence: Sequence[Document] = ()) -> NextQuery:
        """A query unlike every one in `previous`, from the bridge candidates of `evidence`
        (the kept chunks) or the writer (see the module docstring)."""
        seen = {normalise_query(q) for q in previous}
        if self.config.query_source == "bridge":
            bridged = self._bridge_query(question, memory, evidence, seen)
            if bridged is not None:
                return bridged
        prompt = self.query_prompt.messages(
            question=question, memory=shown_memory(memory),
            queries="\n".join(f"- {q}" for q in previous))
        settings = GenerationSettings(max_new_tokens=self.config.query_max_new_tokens,
                                      stop=("\n",))
        written = self.backend.generate([prompt], settings, agent="query_writer")[0]
        query = clean_query(written)
        if normalise_query(query) and normalise_query(query) not in seen:
            return NextQuery(query, "writer", written)
        variation = expanded_query(question, memory, self.config.expansion_terms)
        if normalise_query(variation) not in seen:
            return NextQuery(variation, "variation", written)
        return NextQuery(None, "none", written)

    def _bridge_query(self, question: str, memory: str, evidence: Sequence[Document],
                      seen: set[str]) -> NextQuery | None:
        """The best-scored fresh candidate followed by the question; None without one."""
        names = [n for n in bridge_candidates(question, evidence, self.config.max_candidates)
                 if normalise_query(f"{n} {question}") not in seen]
        if not names:
            return None
        prompts = [self.bridge_prompt.messages(question=question, memory=shown_memory(memory),
                                               candidate=name) for name in names]
        scored = self.backend.label_logprobs(prompts, [YES, NO], agent="bridge_scorer")
        p_yes = [p_relevant(relevance_log_odds(logprobs, YES, NO)) for logprobs in scored]
        best = max(range(len(names)), key=lambda i: (p_yes[i], -i))
        return NextQuery(f"{names[best]} {question}", "bridge", "",
                         tuple(zip(names, p_yes, strict=True)))
