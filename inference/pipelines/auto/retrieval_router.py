"""Conditional routing (Auto-RAG): decide per question whether retrieval is worth it.

Two rules, chosen by `RouterConfig.rule`:

`knowledge` (the default) is the Auto-RAG study's rule: retrieve when the question's
similarity to what the model knows is *below* a threshold, or the question is complex.
* `knowledge_similarity` — the cosine similarity, in a sentence encoder's embedding
  (`embedding_model`), of the question and the model's closed-book draft answer (the raw
  reply of the very `direct` pipeline that `auto` answers with: same prompt, same
  generation settings), rounded to 4 places. A model that knows the answer drafts a reply on
  the question's subject; one that does not drifts or hedges, and its draft moves away from
  the question. The study names the feature, not how to measure it: this is our
  operationalisation of "similarity to what the model knows", with an embedding and no
  extra model call on the questions the model answers alone — there the draft *is* the
  answer `auto` returns (on the others it is one generator call more).
* `complexity` — how many complexity signals the question shows: an intent word, a long
  question (`query_tokens ≥ long_query_tokens`), names (`len(entities) ≥ min_entity_words`,
  unless that is 0).
Retrieve when `knowledge_similarity < min_knowledge_similarity` or
`complexity ≥ min_complexity` (0 turns complexity off), or — with `self_check` on — the
self-check doubts the model (`self_check < self_check_threshold`); otherwise the model
knows it and its draft is the answer.

`corpus-match` is the earlier rule, kept as an option:
1. The corpus cannot help, so skip: no passage matches (`top_score < min_top_score`) or the
   question is mostly outside the corpus's language
   (`vocabulary_overlap < min_vocabulary_overlap`).
2. Retrieve when the question needs evidence: it has an intent word, or is long
   (`query_tokens ≥ long_query_tokens`), or names an entity
   (`len(entities) ≥ min_entity_words`), or one passage matches it decisively
   (`score_margin ≥ min_score_margin`), or the self-check doubts the model
   (`self_check < self_check_threshold`).
3. With self-check on, a model that is confident it knows the answer skips even then;
   otherwise a question with no need signalled is answered directly.

Features recorded with every decision (both rules; the knowledge rule adds the two above):
* `query_tokens` — words in the question;
* `intent` — the intent words/phrases it contains (why, how, explain, compare, according to…);
* `entities` — the names it mentions: capitalised words inside a sentence ("Edward Corser",
  "Nobel Prize"), the mark of an entity-centric question;
* `vocabulary_overlap` — share of its distinct content terms (stemmed, stop words dropped,
  as the BM25 index tokenises; question words and auxiliaries left out) that occur in the
  corpus vocabulary;
* `top_score`, `score_margin` — the best BM25 score of a quick top-2 search and the relative
  gap to the second (how decisively one passage of the corpus matches);
* `self_check` (optional) — P("Yes") that the model can answer without documents, from
  label log-probs of one forward pass.
The corpus features are None without a BM25 index, `self_check` is None unless switched on.

The knowledge rule's thresholds (`min_knowledge_similarity` 0.5, `min_complexity` 1) are
starting values, not yet tuned on a benchmark.

Why the corpus-match rule's defaults (tuned on tests/benchmarks/bench_router.py under that
rule: HotpotQA + PopQA + nutrition questions over one corpus holding all their evidence):
* Vocabulary overlap is a gate, not a reason to retrieve. As a reason (overlap ≥ 0.8) it
  fired on every question of that benchmark — a corpus that covers the questions speaks their
  language — so the router retrieved 68 of 68. As a gate at 0.5 it still sends questions
  about things the corpus never mentions straight to the model.
* Names are the reason instead: entity-centric questions about long-tail people, works and
  places are where a model's own memory fails and retrieval pays (Mallen et al., 2023,
  "When Not to Trust Language Models", which retrieves for less popular entities). General
  questions without names, intent words or a decisive passage ("Which enzyme breaks down
  lactose?") are the ones a capable model answers alone.
* `min_score_margin` 0.25 (unchanged): questions about a detail the textbook states mostly
  had one page standing out (margins 0.4–0.7); general ones matched many pages alike
  (mostly under 0.15).
On that set (68 questions) the rule skips the 11 general nutrition questions and nothing
else: generator input tokens −19 %, accuracy 0.221 against 0.265 for always-retrieve (0.191
for never). The embedded 135M generator knows little even of general knowledge, so with it
skipping costs accuracy; a larger generator, or the self-check mode, is where the saving
comes cheaper. The thresholds were set on the benchmark's own questions: read its figures
as a check of the rule's behaviour, not as held-out accuracy.
"""

from __future__ import annotations

import re
from dataclasses import field
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import ConfigDict, Field, JsonValue

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.io_utils import JsonlRecord
from sieverag.inference.core.prompt_templates import load_template
from sieverag.inference.core.settings import Section, at_least, settings
from sieverag.inference.filters.filter_format import p_relevant, relevance_log_odds
from sieverag.inference.llm.backend_protocol import LLMBackend

if TYPE_CHECKING:
    from sieverag.inference.retrieval.dense import Encoder

DEFAULT_INTENT_WORDS = ("why", "how", "explain", "compare", "according to", "describe",
                        "difference between", "what are the", "list", "which of")

RouterRule = Literal["knowledge", "corpus-match"]


@settings
class RouterConfig:
    """The retrieve-or-not rule and its thresholds (see the module docstring)."""

    rule: RouterRule = field(default="knowledge", metadata={
        "help": "knowledge (the study's: retrieve when the model's draft answer is far from "
                "the question, or the question is complex) or corpus-match (skip when the "
                "corpus has no match, else retrieve on a need signal)"})
    embedding_model: str = field(default="all-minilm-l6-v2", metadata={
        "help": "sentence encoder of the knowledge rule's similarity (embedded model name or "
                "a local sentence-transformers folder)"})
    min_knowledge_similarity: float = field(default=0.5, metadata={
        "help": "knowledge rule: a question-draft cosine below this retrieves"})
    min_complexity: int = field(default=1, metadata={
        "help": "knowledge rule: this many complexity signals (intent, long, names) "
                "retrieve; 0 turns complexity off"})
    intent_words: tuple[str, ...] = field(default=DEFAULT_INTENT_WORDS,
                                          metadata={"help": "words/phrases signalling need"})
    long_query_tokens: int = field(default=15, metadata={"help": "a question this long retrieves"})
    min_entity_words: int = field(default=1, metadata={
        "help": "a question naming this many capitalised words retrieves; 0 turns it off"})
    min_vocabulary_overlap: float = field(default=0.5, metadata={
        "help": "corpus-match rule: below this share of terms in the corpus vocabulary: skip"})
    min_top_score: float = field(default=1.0, metadata={
        "help": "corpus-match rule: below, the corpus has nothing: skip"})
    min_score_margin: float = field(default=0.25, metadata={
        "help": "corpus-match rule: relative top-1/top-2 gap that retrieves"})
    self_check: bool = field(default=False, metadata={"help": "also ask the model itself"})
    self_check_threshold: float = field(default=0.5,
                                        metadata={"help": "P(can answer) below this retrieves"})

    def __post_init__(self) -> None:
        for name in ("min_vocabulary_overlap", "self_check_threshold", "min_score_margin"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"router.{name} must be in [0, 1], got {value}")
        if not -1.0 <= self.min_knowledge_similarity <= 1.0:
            raise ConfigError("router.min_knowledge_similarity must be in [-1, 1] (a cosine), "
                              f"got {self.min_knowledge_similarity}")
        at_least(1, "router.", long_query_tokens=self.long_query_tokens)
        at_least(0, "router.", min_entity_words=self.min_entity_words,
                 min_top_score=self.min_top_score, min_complexity=self.min_complexity)
        if any(not w.strip() for w in self.intent_words):
            raise ConfigError("router.intent_words must be non-empty strings, got "
                              f"{list(self.intent_words)!r}")
        if not self.embedding_model.strip():
            raise ConfigError("router.embedding_model must name a sentence encoder")


ROUTER_SECTION = Section("router", RouterConfig, "the `auto` pipeline's retrieve-or-not rule")


class RouteDecision(JsonlRecord):
    """Whether to retrieve, why, and the features behind it (`auto`'s `route` in a trace)."""

    model_config = ConfigDict(frozen=True)

    retrieve: bool = Field(description="whether the routed pipeline ran (else a direct answer)")
    reason: str = Field(description="the rule that decided, in words")
    features: dict[str, JsonValue] = Field(description="the decision's inputs by name (see the "
                                                       "module docstring)")


_WORD = re.compile(r"[A-Za-z0-9']+")
# Not stop words to BM25, but no content either: left out of the vocabulary overlap.
_QUESTION_WORDS = ("what", "which", "who", "whom", "whose", "when", "where", "why", "how",
                   "do", "does", "did", "can", "could", "would", "should", "has", "have", "had",
                   "were")
_EDGE_PUNCTUATION = "\"'“”‘’()[]{},;:?!."


class Router:
    """Decides per question; `index` (an `inference.retrieval.Index`) gives corpus features,
    `backend` the self-check, `embed` (texts → one embedding per row) the knowledge rule's
    similarity."""

    def __init__(self, config: RouterConfig = RouterConfig(), index=None,
                 backend: LLMBackend | None = None, embed: Encoder | None = None) -> None:
        if config.self_check and backend is None:
            raise ConfigError("router.self_check needs a model backend")
        if config.rule == "knowledge" and embed is None:
            raise ConfigError("router.rule `knowledge` needs a sentence encoder (built from "
                              "router.embedding_model); choose router.rule `corpus-match` "
                              "to route without one")
        self.config = config
        self.index = index
        self.backend = backend
        self.embed = embed
        self.self_check_prompt = load_template("router_self_check")
        self._intent = [(w, re.compile(rf"\b{re.escape(w.lower())}\b"))
                        for w in config.intent_words]

    @property
    def needs_draft(self) -> bool:
        """Whether `decide` reads the model's closed-book draft answer (the knowledge rule)."""
        return self.config.rule == "knowledge"

    def features(self, question: str, draft: str | None = None) -> dict:
        """The decision's inputs (see the module docstring); corpus ones are None without
        a BM25 index, `self_check` is None unless it is switched on. Under the knowledge rule
        `draft`, the model's direct answer, gives `knowledge_similarity`."""
        lowered = question.lower()
        features: dict = {"query_tokens": len(_WORD.findall(lowered)),
                          "intent": [w for w, pattern in self._intent if pattern.search(lowered)],
                          "entities": entity_words(question),
                          "vocabulary_overlap": None, "top_score": None, "score_margin": None,
                          "self_check": None}
        bm25 = getattr(self.index, "bm25", None)
        if bm25 is not None:
            features.update(_corpus_features(bm25, question))
        if self.config.self_check and self.backend is not None:
            prompt = self.self_check_prompt.messages(question=question)
            scores = self.backend.label_logprobs([prompt], ["Yes", "No"], agent="router")[0]
            features["self_check"] = round(p_relevant(relevance_log_odds(scores)), 4)
        if self.needs_draft:
            if draft is None:
                raise ValueError("the knowledge rule needs the model's draft answer")
            features["knowledge_similarity"] = self._similarity(question, draft)
            features["complexity"] = len(self._complexity_signals(features))
        return features

    def decide(self, question: str, draft: str | None = None) -> RouteDecision:
        """Retrieve or answer directly, with the reason and the features; the knowledge rule
        needs `draft`, the model's raw direct answer to the question."""
        f = self.features(question, draft)
        if self.needs_draft:
            return self._decide_by_knowledge(f)
        return self._decide_by_corpus_match(f)

    def _similarity(self, question: str, draft: str) -> float:
        """Cosine of the question's and the draft's embeddings (0 where one is all zeros)."""
        vectors = np.asarray(self.embed([question, draft]), dtype=np.float64)
        norms = np.linalg.norm(vectors, axis=1)
        if not norms.all():
            return 0.0
        return round(float(vectors[0] @ vectors[1] / (norms[0] * norms[1])), 4)

    def _complexity_signals(self, f: dict) -> list[str]:
        c = self.config
        signals = []
        if f["intent"]:
            signals.append("intent: " + ", ".join(f["intent"]))
        if f["query_tokens"] >= c.long_query_tokens:
            signals.append("long question")
        if c.min_entity_words and len(f["entities"]) >= c.min_entity_words:
            signals.append("names: " + ", ".join(f["entities"]))
        return signals

    def _decide_by_knowledge(self, f: dict) -> RouteDecision:
        c = self.config
        similarity = f["knowledge_similarity"]
        doubts = []
        if similarity < c.min_knowledge_similarity:
            doubts.append(f"low similarity to the model's knowledge "
                          f"({similarity} < {c.min_knowledge_similarity})")
        if c.min_complexity and f["complexity"] >= c.min_complexity:
            doubts.append("complex: " + "; ".join(self._complexity_signals(f)))
        if f["self_check"] is not None and f["self_check"] < c.self_check_threshold:
            doubts.append("model unsure")
        if doubts:
            return RouteDecision(retrieve=True, reason="; ".join(doubts), features=f)
        return RouteDecision(retrieve=False, features=f,
                             reason=f"model knows it (similarity {similarity})")

    def _decide_by_corpus_match(self, f: dict) -> RouteDecision:
        c = self.config
        if f["top_score"] is not None and f["top_score"] < c.min_top_score:
            return RouteDecision(retrieve=False, reason="corpus has no match", features=f)
        if f["vocabulary_overlap"] is not None and \
                f["vocabulary_overlap"] < c.min_vocabulary_overlap:
            return RouteDecision(retrieve=False, reason="question outside the corpus vocabulary",
                                 features=f)
        confident = f["self_check"] is not None and f["self_check"] >= c.self_check_threshold
        needs = self._complexity_signals(f)
        if f["score_margin"] is not None and f["score_margin"] >= c.min_score_margin:
            needs.append("decisive corpus match")
        if f["self_check"] is not None and not confident:
            needs.append("model unsure")
        if needs and not confident:
            return RouteDecision(retrieve=True, reason="; ".join(needs), features=f)
        return RouteDecision(retrieve=False, features=f,
                             reason="model confident" if confident else "no need signalled")


def entity_words(question: str) -> list[str]:
    """Capitalised words of two letters or more that do not open a sentence: the names a
    question uses ("Edward Corser", "Nobel Prize"; not "I" or vitamin "C")."""
    names = []
    previous = ""
    for position, token in enumerate(question.split()):
        word = token.strip(_EDGE_PUNCTUATION)
        ends = previous.rstrip("\"'”’)")
        abbreviation = ends.endswith(".") and ends[:1].isupper() and len(ends) <= 4  # "Dr."
        opens_sentence = position == 0 or (ends.endswith((".", "?", "!", ":"))
                                           and not abbreviation)
        letters = sum(character.isalpha() for character in word)  # not "I", not vitamin "C"
        if word[:1].isupper() and letters >= 2 and not opens_sentence:
            names.append(word)
        previous = token
    return names


def _corpus_features(bm25, question: str) -> dict:
    """Vocabulary overlap and the top-2 BM25 scores, from one tokenisation of the question."""
    from sieverag.inference.retrieval.bm25 import make_tokenizer

    # A fresh tokenizer stems every word, known or not; the index's vocabulary then says
    # which stems the corpus has (the same stems `BM25Index.tokenize_queries` would keep).
    stems, asking = make_tokenizer(bm25.config).tokenize(
        [question, " ".join(_QUESTION_WORDS)], update_vocab=True, return_as="string",
        show_progress=False)
    stems = [s for s in stems if s]
    vocabulary = bm25.tokenizer.get_vocab_dict()
    content = set(stems) - set(asking)
    overlap = (round(len({s for s in content if s in vocabulary}) / len(content), 4)
               if content else None)
    hits = bm25.search_tokens([[vocabulary[s] for s in stems if s in vocabulary]], 2)[0]
    top = hits[0][1] if hits else 0.0
    second = hits[1][1] if len(hits) > 1 else 0.0
    return {"vocabulary_overlap": overlap, "top_score": round(top, 4),
            "score_margin": round((top - second) / top, 4) if top > 0 else 0.0}
