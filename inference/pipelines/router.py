"""Conditional routing (Auto-RAG): decide per question whether retrieval is worth it.

Features, all cheap and recorded with every decision:
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

Decision rule (thresholds in `RouterConfig`):
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

Why these defaults (tuned on tests/benchmarks/bench_router.py: HotpotQA + PopQA + nutrition
questions over one corpus holding all their evidence):
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

from pydantic import ConfigDict, Field, JsonValue

from sieverag.inference.errors import ConfigError
from sieverag.inference.filters.filter_format import p_relevant, relevance_log_odds
from sieverag.inference.io_utils import JsonlRecord
from sieverag.inference.llm.base import LLMBackend
from sieverag.inference.prompt_templates import load_template
from sieverag.inference.settings import settings

DEFAULT_INTENT_WORDS = ("why", "how", "explain", "compare", "according to", "describe",
                        "difference between", "what are the", "list", "which of")


@settings
class RouterConfig:
    """Thresholds of the retrieve-or-not decision (see the module docstring)."""

    intent_words: tuple[str, ...] = field(default=DEFAULT_INTENT_WORDS,
                                          metadata={"help": "words/phrases signalling need"})
    long_query_tokens: int = field(default=15, metadata={"help": "a question this long retrieves"})
    min_entity_words: int = field(default=1, metadata={
        "help": "a question naming this many capitalised words retrieves; 0 turns it off"})
    min_vocabulary_overlap: float = field(default=0.5, metadata={
        "help": "below this share of terms in the corpus vocabulary: skip"})
    min_top_score: float = field(default=1.0, metadata={"help": "below: the corpus has nothing"})
    min_score_margin: float = field(default=0.25,
                                    metadata={"help": "relative top-1/top-2 gap that retrieves"})
    self_check: bool = field(default=False, metadata={"help": "also ask the model itself"})
    self_check_threshold: float = field(default=0.5,
                                        metadata={"help": "P(can answer) below this retrieves"})

    def __post_init__(self) -> None:
        for name in ("min_vocabulary_overlap", "self_check_threshold", "min_score_margin"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"router.{name} must be in [0, 1], got {value}")
        for name, minimum in (("long_query_tokens", 1), ("min_entity_words", 0),
                              ("min_top_score", 0)):
            value = getattr(self, name)
            if value < minimum:
                raise ConfigError(f"router.{name} must be >= {minimum}, got {value}")
        if any(not w.strip() for w in self.intent_words):
            raise ConfigError("router.intent_words must be non-empty strings, got "
                              f"{list(self.intent_words)!r}")


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
    """Decides per question; `index` (an `inference.retrieval.Index`) gives corpus features."""

    def __init__(self, config: RouterConfig = RouterConfig(), index=None,
                 backend: LLMBackend | None = None) -> None:
        if config.self_check and backend is None:
            raise ConfigError("router.self_check needs a model backend")
        self.config = config
        self.index = index
        self.backend = backend
        self.self_check_prompt = load_template("router_self_check")
        self._intent = [(w, re.compile(rf"\b{re.escape(w.lower())}\b"))
                        for w in config.intent_words]

    def features(self, question: str) -> dict:
        """The decision's inputs (see the module docstring); corpus ones are None without
        a BM25 index, `self_check` is None unless it is switched on."""
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
        return features

    def decide(self, question: str) -> RouteDecision:
        """Retrieve or answer directly, with the reason and the features."""
        f = self.features(question)
        c = self.config
        if f["top_score"] is not None and f["top_score"] < c.min_top_score:
            return RouteDecision(retrieve=False, reason="corpus has no match", features=f)
        if f["vocabulary_overlap"] is not None and \
                f["vocabulary_overlap"] < c.min_vocabulary_overlap:
            return RouteDecision(retrieve=False, reason="question outside the corpus vocabulary",
                                 features=f)
        confident = f["self_check"] is not None and f["self_check"] >= c.self_check_threshold
        needs = []
        if f["intent"]:
            needs.append("intent: " + ", ".join(f["intent"]))
        if f["query_tokens"] >= c.long_query_tokens:
            needs.append("long question")
        if c.min_entity_words and len(f["entities"]) >= c.min_entity_words:
            needs.append("names: " + ", ".join(f["entities"]))
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
