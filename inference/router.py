"""Conditional routing (Auto-RAG): decide per question whether retrieval is worth it.

Features, all cheap and recorded with every decision:
* `query_tokens` — words in the question;
* `intent` — the intent words/phrases it contains (why, how, explain, compare, according to…);
* `vocabulary_overlap` — share of its content terms (stemmed, stop words dropped, as the
  BM25 index tokenises) that occur in the corpus vocabulary: high means domain language;
* `top_score`, `score_margin` — the best BM25 score of a quick top-2 search and the relative
  gap to the second (how confidently the corpus matches);
* `self_check` (optional) — P("Yes") that the model can answer without documents, from
  label log-probs of one forward pass.

Decision rule (thresholds in `RouterConfig`): retrieve when the corpus matches at all
(`top_score ≥ min_top_score`) and the question needs evidence — it has an intent word, or is
long (`query_tokens ≥ long_query_tokens`), or is in the corpus's language
(`vocabulary_overlap ≥ min_vocabulary_overlap`), or the corpus matches it decisively
(`score_margin ≥ min_score_margin`), or the self-check doubts the model
(`self_check < self_check_threshold`). With self-check on, a model that is confident it knows
the answer skips retrieval even then. Otherwise the question is answered directly.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

from inference.errors import ConfigError
from inference.llm.base import LLMBackend
from inference.prompt_templates import load_template

DEFAULT_INTENT_WORDS = ("why", "how", "explain", "compare", "according to", "describe",
                        "difference between", "what are the", "list", "which of")


@dataclass(frozen=True)
class RouterConfig:
    """Thresholds of the retrieve-or-not decision (see the module docstring)."""

    intent_words: tuple[str, ...] = field(default=DEFAULT_INTENT_WORDS,
                                          metadata={"help": "words/phrases signalling need"})
    long_query_tokens: int = field(default=15, metadata={"help": "a question this long retrieves"})
    min_vocabulary_overlap: float = field(default=0.8,
                                          metadata={"help": "share of terms in corpus vocabulary"})
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
        if self.long_query_tokens < 1:
            raise ConfigError(f"router.long_query_tokens must be >= 1, got "
                              f"{self.long_query_tokens}")


@dataclass(frozen=True)
class RouteDecision:
    """Whether to retrieve, why, and the features behind it."""

    retrieve: bool
    reason: str
    features: dict

    def to_dict(self) -> dict:
        return asdict(self)


_WORD = re.compile(r"[A-Za-z0-9']+")


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

    def features(self, question: str) -> dict:
        lowered = question.lower()
        words = _WORD.findall(lowered)
        intent = [w for w in self.config.intent_words
                  if re.search(rf"\b{re.escape(w)}\b", lowered)]
        features: dict = {"query_tokens": len(words), "intent": intent,
                          "vocabulary_overlap": None, "top_score": None, "score_margin": None,
                          "self_check": None}
        bm25 = getattr(self.index, "bm25", None)
        if bm25 is not None:
            features["vocabulary_overlap"] = _vocabulary_overlap(bm25, question)
            hits = bm25.search([question], 2)[0]
            if hits:
                top = hits[0][1]
                second = hits[1][1] if len(hits) > 1 else 0.0
                features["top_score"] = round(top, 4)
                features["score_margin"] = round((top - second) / top, 4) if top > 0 else 0.0
            else:
                features["top_score"], features["score_margin"] = 0.0, 0.0
        if self.config.self_check and self.backend is not None:
            prompt = self.self_check_prompt.messages(question=question)
            scores = self.backend.label_logprobs([prompt], ["Yes", "No"], agent="router")[0]
            yes, no = math.exp(scores["Yes"]), math.exp(scores["No"])
            features["self_check"] = round(yes / (yes + no), 4) if yes + no > 0 else 0.5
        return features

    def decide(self, question: str) -> RouteDecision:
        """Retrieve or answer directly, with the reason and the features."""
        f = self.features(question)
        c = self.config
        if f["top_score"] is not None and f["top_score"] < c.min_top_score:
            return RouteDecision(False, "corpus has no match", f)
        confident = f["self_check"] is not None and f["self_check"] >= c.self_check_threshold
        needs = []
        if f["intent"]:
            needs.append("intent: " + ", ".join(f["intent"]))
        if f["query_tokens"] >= c.long_query_tokens:
            needs.append("long question")
        if f["vocabulary_overlap"] is not None and \
                f["vocabulary_overlap"] >= c.min_vocabulary_overlap:
            needs.append("corpus vocabulary")
        if f["score_margin"] is not None and f["score_margin"] >= c.min_score_margin:
            needs.append("decisive corpus match")
        if f["self_check"] is not None and not confident:
            needs.append("model unsure")
        if needs and not confident:
            return RouteDecision(True, "; ".join(needs), f)
        return RouteDecision(False, "model confident" if confident else "no need signalled", f)


def _vocabulary_overlap(bm25, question: str) -> float | None:
    from inference.retrieval.bm25 import make_tokenizer

    stems = make_tokenizer(bm25.config).tokenize([question], update_vocab=True,
                                                 return_as="string", show_progress=False)[0]
    stems = [s for s in stems if s]
    if not stems:
        return None
    vocabulary = bm25.tokenizer.stem_to_sid or bm25.tokenizer.word_to_id
    return round(sum(s in vocabulary for s in stems) / len(stems), 4)
