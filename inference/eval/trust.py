"""Trust-aware answer metrics (after the Auto-RAG paper), each defined next to its code.

All are pure functions of the answer, the documents the generator read and, where needed, an
embedding function `embed(texts) -> array (len(texts), dim)` (any sentence encoder; tests pass
a fake). "Content tokens" are the distinct lower-cased word tokens (`\\w+`) of a text minus
English stop words. A metric that is undefined for an input returns None, never a guess.

The LLM-as-a-judge helper asks any backend for six 1–5 scores as JSON, with its prompt in
`inference/prompts/llm_judge_eval.yaml`, and parses the reply strictly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from sieverag.inference.errors import ConfigError, DatasetError
from sieverag.inference.io_utils import parse_json
from sieverag.inference.llm.base import GenerationSettings, LLMBackend
from sieverag.inference.prompt_templates import load_template
from sieverag.inference.retrieval.sentences import split_sentences
from sieverag.inference.types import Document

Embed = Callable[[Sequence[str]], np.ndarray]
Evidence = Document | str

STOP_WORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further
had has have having he her here hers herself him himself his how i if in into is it its itself
just me more most my myself no nor not now of off on once only or other our ours ourselves out
over own same she should so some such than that the their theirs them themselves then there
these they this those through to too under until up very was we were what when where which
while who whom why will with would you your yours yourself yourselves also s t
""".split())
_TOKEN = re.compile(r"\w+")


def content_tokens(text: str) -> set[str]:
    """Distinct lower-cased `\\w+` tokens of `text` that are not stop words."""
    return {t for t in _TOKEN.findall(text.lower()) if t not in STOP_WORDS}


def _text(evidence: Evidence) -> str:
    return evidence if isinstance(evidence, str) else evidence.as_context()


def faithfulness(answer: str, documents: Sequence[Evidence]) -> float | None:
    """Share of the answer's content tokens that occur in the documents read.

    faithfulness = |content(answer) ∩ content(documents)| / |content(answer)|.
    None when the answer has no content token (it asserts nothing checkable).
    """
    claimed = content_tokens(answer)
    if not claimed:
        return None
    read: set[str] = set()
    for document in documents:
        read |= content_tokens(_text(document))
    return len(claimed & read) / len(claimed)


def hallucination_rate(answer: str, documents: Sequence[Evidence]) -> float | None:
    """1 − faithfulness: the share of answer content tokens found in no document read."""
    score = faithfulness(answer, documents)
    return None if score is None else 1.0 - score


def context_precision_used(answer: str, documents: Sequence[Evidence]) -> float | None:
    """Share of the documents read that the answer used.

    A document counts as used when it shares at least one content token with the answer.
    None when no document was read.
    """
    if not documents:
        return None
    claimed = content_tokens(answer)
    used = sum(1 for d in documents if claimed & content_tokens(_text(d)))
    return used / len(documents)


def context_precision_gold(documents: Sequence[Document]) -> float | None:
    """Share of the documents read that are gold (`is_gold` True).

    None when no document was read or none carries gold information (`is_gold` None).
    """
    if not documents or all(d.is_gold is None for d in documents):
        return None
    return sum(1 for d in documents if d.is_gold) / len(documents)


def _unit_rows(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1.0, norms)


def _document_sentences(document: Evidence) -> list[str]:
    if isinstance(document, Document) and document.sentences:
        return [s for s in document.sentences if s.strip()]
    return split_sentences(_text(document))


def sentence_support_rate(answer: str, documents: Sequence[Evidence], embed: Embed,
                          threshold: float = 0.5) -> float | None:
    """Share of answer sentences supported by some sentence of the documents read.

    An answer sentence is supported when the cosine similarity of its embedding to the
    embedding of at least one document sentence is ≥ `threshold` (default 0.5).
    Document sentences are the data's own split where a Document has one, else
    `split_sentences`. None when the answer has no sentence; 0.0 when nothing was read.
    """
    claims = split_sentences(answer)
    if not claims:
        return None
    evidence = [s for d in documents for s in _document_sentences(d)]
    if not evidence:
        return 0.0
    vectors = _unit_rows(embed([*claims, *evidence]))
    similarity = vectors[: len(claims)] @ vectors[len(claims) :].T
    return float(np.mean(similarity.max(axis=1) >= threshold))


def _weighted_mean(values: Mapping[str, float | None], weights: Mapping[str, float]
                   ) -> float | None:
    present = {name: v for name, v in values.items() if v is not None and weights[name] > 0}
    total = sum(weights[name] for name in present)
    if not present or total == 0:
        return None
    return sum(weights[name] * v for name, v in present.items()) / total


@dataclass(frozen=True)
class TrustWeights:
    """Weights of the combined trust score (renormalised over the components present)."""

    faithfulness: float = field(default=0.4, metadata={"help": "weight of faithfulness"})
    sentence_support: float = field(default=0.3, metadata={
        "help": "weight of the sentence support rate"})
    context_precision: float = field(default=0.3, metadata={
        "help": "weight of context precision (used documents)"})

    def __post_init__(self) -> None:
        values = asdict(self)
        if any(v < 0 for v in values.values()) or sum(values.values()) == 0:
            raise ConfigError(f"trust weights must be >= 0 and not all 0, got {values}")


def trust_score(faithfulness: float | None, sentence_support: float | None,
                context_precision: float | None,
                weights: TrustWeights = TrustWeights()) -> float | None:
    """Combined trust score in [0, 1].

    trust = (0.4·faithfulness + 0.3·sentence support + 0.3·context precision) / Σ weights
    of the components that are defined (None components are left out and the weights
    renormalised; None when none is defined). Faithfulness weighs most because an answer's
    unsupported content is the failure trust metrics exist to catch; the two others say
    whether support holds sentence by sentence and whether the reading was well targeted.
    """
    return _weighted_mean(
        {"faithfulness": faithfulness, "sentence_support": sentence_support,
         "context_precision": context_precision}, asdict(weights))


@dataclass(frozen=True)
class TrustReport:
    """All trust metrics of one answer (None where undefined)."""

    faithfulness: float | None
    hallucination_rate: float | None
    context_precision_used: float | None
    context_precision_gold: float | None
    sentence_support_rate: float | None
    trust_score: float | None

    def to_dict(self) -> dict[str, float | None]:
        return asdict(self)


def trust_report(answer: str, documents: Sequence[Document], embed: Embed | None = None,
                 threshold: float = 0.5, weights: TrustWeights = TrustWeights()) -> TrustReport:
    """Every trust metric for one answer; sentence support needs `embed` (else None)."""
    faithful = faithfulness(answer, documents)
    used = context_precision_used(answer, documents)
    support = (sentence_support_rate(answer, documents, embed, threshold)
               if embed is not None else None)
    return TrustReport(
        faithfulness=faithful,
        hallucination_rate=None if faithful is None else 1.0 - faithful,
        context_precision_used=used,
        context_precision_gold=context_precision_gold(documents),
        sentence_support_rate=support,
        trust_score=trust_score(faithful, support, used, weights),
    )


def keyword_coverage(answer: str, reference: str) -> float | None:
    """Share of the reference's content tokens present in the answer (None if it has none)."""
    wanted = content_tokens(reference)
    if not wanted:
        return None
    return len(wanted & content_tokens(answer)) / len(wanted)


@dataclass(frozen=True)
class QualityWeights:
    """Weights of the answer quality score."""

    similarity: float = field(default=0.6, metadata={
        "help": "weight of embedding similarity to the reference"})
    keywords: float = field(default=0.4, metadata={"help": "weight of keyword coverage"})

    def __post_init__(self) -> None:
        if self.similarity < 0 or self.keywords < 0 or self.similarity + self.keywords == 0:
            raise ConfigError(f"quality weights must be >= 0 and not both 0, got "
                              f"similarity={self.similarity}, keywords={self.keywords}")


def answer_quality(answer: str, references: str | Sequence[str], embed: Embed,
                   weights: QualityWeights = QualityWeights()) -> float | None:
    """Answer quality in [0, 1] against the reference answer(s).

    For each reference: quality = (0.6·max(0, cos(embed(answer), embed(reference)))
    + 0.4·keyword coverage) / Σ weights, leaving out keyword coverage when the reference
    has no content token; the best reference counts (answers list aliases). Similarity
    weighs more because it credits paraphrases, which keyword coverage misses; coverage
    keeps a fluent answer that drops the key facts from scoring high. An empty answer
    scores 0.0; None when there is no reference.
    """
    refs = [references] if isinstance(references, str) else list(references)
    refs = [r for r in refs if r.strip()]
    if not refs:
        return None
    if not answer.strip():
        return 0.0
    vectors = _unit_rows(embed([answer, *refs]))
    cosines = np.clip(vectors[1:] @ vectors[0], 0.0, 1.0)
    scores = [_weighted_mean({"similarity": float(cos), "keywords": keyword_coverage(answer, r)},
                             asdict(weights)) for cos, r in zip(cosines, refs, strict=True)]
    return max(s for s in scores if s is not None)


# --- LLM-as-a-judge -----------------------------------------------------------------------

JUDGE_CRITERIA = ("correctness", "relevance", "completeness", "evidence_grounding",
                  "hallucination_risk", "overall")
JUDGE_PROMPT = "llm_judge_eval"
_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


@dataclass(frozen=True)
class JudgeVerdict:
    """Six 1–5 scores (higher is better; `hallucination_risk` 5 = no invented content).

    When the reply is not a valid verdict every score is None and `error` says why;
    `raw` keeps the reply either way.
    """

    correctness: int | None = None
    relevance: int | None = None
    completeness: int | None = None
    evidence_grounding: int | None = None
    hallucination_risk: int | None = None
    overall: int | None = None
    error: str | None = None
    raw: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    def scores(self) -> dict[str, int | None]:
        return {name: getattr(self, name) for name in JUDGE_CRITERIA}


def parse_judge_reply(reply: str) -> JudgeVerdict:
    """Parse a judge reply strictly: one JSON object (surrounding text and code fences are
    ignored) holding every criterion as an integer 1–5; other keys are ignored."""
    match = _JSON_OBJECT.search(reply)
    if match is None:
        return JudgeVerdict(error="no JSON object in the reply", raw=reply)
    try:  # any text json cannot read (syntax, huge numbers, deep nesting) is a bad reply
        payload: Any = parse_json(match.group(), "the reply")
    except DatasetError as error:
        return JudgeVerdict(error=str(error), raw=reply)
    if not isinstance(payload, dict):
        return JudgeVerdict(error="the JSON is not an object", raw=reply)
    missing = [name for name in JUDGE_CRITERIA if name not in payload]
    if missing:
        return JudgeVerdict(error=f"missing score(s): {', '.join(missing)}", raw=reply)
    invalid = [name for name in JUDGE_CRITERIA
               if type(payload[name]) is not int or not 1 <= payload[name] <= 5]
    if invalid:
        return JudgeVerdict(error=f"score(s) not an integer 1-5: {', '.join(invalid)}",
                            raw=reply)
    return JudgeVerdict(**{name: payload[name] for name in JUDGE_CRITERIA}, raw=reply)


def _format_documents(documents: Sequence[Evidence]) -> str:
    if not documents:
        return "(none)"
    return "\n\n".join(f"[{i}] {_text(d)}" for i, d in enumerate(documents, start=1))


def judge_answers(backend: LLMBackend, items: Sequence[tuple[str, str, str, Sequence[Evidence]]],
                  settings: GenerationSettings = GenerationSettings(max_new_tokens=128)
                  ) -> list[JudgeVerdict]:
    """`judge_answer` for many (question, answer, reference, documents) items, one batch."""
    template = load_template(JUDGE_PROMPT)
    prompts = [template.messages(question=q, answer=a, reference=r,
                                 documents=_format_documents(d)) for q, a, r, d in items]
    replies = backend.generate(prompts, settings, agent="eval_judge") if prompts else []
    return [parse_judge_reply(reply) for reply in replies]


def judge_answer(backend: LLMBackend, question: str, answer: str, reference: str,
                 documents: Sequence[Evidence],
                 settings: GenerationSettings = GenerationSettings(max_new_tokens=128)
                 ) -> JudgeVerdict:
    """Ask `backend` to grade one answer on the six criteria (see `JudgeVerdict`).

    An invalid reply yields None scores with the reason in `error`, never an exception;
    backend failures (a server that is down) propagate as the backend raises them.
    """
    return judge_answers(backend, [(question, answer, reference, documents)], settings)[0]
