"""Trust-aware answer metrics: the Auto-RAG nutrition study's, under its names, and our own
sentence-level variants, under names of their own.

Every metric is a pure function of the question, the answer, the retrieved context the
generator read (documents; their sentences) and, where needed, a sentence encoder
`embed(texts) -> array (len(texts), dim)` (any encoder; tests pass a fake). Two quantities
are shared by several metrics:

* r(q) — whether the answer was produced with retrieval: `auto`'s routing decision where it
  routed, else 1 when the generator read retrieved context; 0 when the model answered alone
  (`direct`, or `auto` routing to the model). Grounding needs context: a question that
  retrieved and read nothing has no grounding figures either.
* support — answer sentence a is supported by context sentence c when
  cos(embed(a), embed(c)) ≥ τ (`support_threshold`, 0.5 by default). Sentences are the
  data's own split where a Document has one, else `split_sentences`.

The study's metrics: AQS (`answer_quality`), TAAS (`taas`, its Eq. 11: AQS, faithfulness and
hallucination control), `faithfulness` (share of the answer's tokens found in the context),
`hallucination_rate` (1 − faithfulness), `sentence_support_rate`, `context_precision`,
`evidence_noise` and the six-criterion LLM grader (the study's LLM-as-a-judge; not the
MAIN-RAG judge, which scores documents).
Ours, named for what they compute: `sentence_taas` (TAAS over the sentence-level grounding
terms, sieverag's TAAS before it took the study's definition), `sentence_similarity` (mean
best cosine of the answer's sentences to the context), `unsupported_sentence_rate`
(1 − sentence support rate), `lexical_context_use` and `context_precision_gold`.

Grounding metrics (all but AQS, the two TAAS and the gold context precision) are not
applicable when r(q) = 0: they are None in the record and left out of the means, which say
how many answers they cover. An answer with no sentence (or no content token), a metric with
no input (no reference, no context sentence) is None too, never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from sieverag.inference.config import (
    NOISE_THRESHOLD,
    SUPPORT_THRESHOLD,
    QualityWeights,
    TAASWeights,
)
from sieverag.inference.errors import DatasetError
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


def _unit_rows(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1.0, norms)


def _document_sentences(document: Evidence) -> list[str]:
    if isinstance(document, Document) and document.sentences:
        return [s for s in document.sentences if s.strip()]
    return split_sentences(_text(document))


def context_sentences(documents: Sequence[Evidence]) -> list[str]:
    """The sentences of the retrieved context, document by document."""
    return [s for d in documents for s in _document_sentences(d)]


@dataclass(frozen=True)
class SupportMatrix:
    """Cosine similarity of every answer sentence (rows) to every context sentence (columns)."""

    answer_sentences: list[str]
    context_sentences: list[str]
    similarity: np.ndarray  # (answer sentences, context sentences)

    @classmethod
    def of(cls, answer: str, documents: Sequence[Evidence], embed: Embed) -> SupportMatrix:
        claims = split_sentences(answer)
        evidence = context_sentences(documents)
        if not claims or not evidence:
            return cls(claims, evidence, np.zeros((len(claims), len(evidence))))
        vectors = _unit_rows(embed([*claims, *evidence]))
        return cls(claims, evidence, vectors[: len(claims)] @ vectors[len(claims):].T)


def sentence_similarity(support: SupportMatrix) -> float | None:
    """Sentence similarity (ours): how closely the answer's sentences restate the context.

    sentence_similarity = mean over answer sentences a of max over context sentences c of
    max(0, cos(a, c)) — 1 when every sentence of the answer restates some sentence read.
    None when the answer has no sentence or nothing was read.
    """
    if not support.answer_sentences or not support.context_sentences:
        return None
    return float(np.mean(np.clip(support.similarity.max(axis=1), 0.0, 1.0)))


def sentence_support_rate(support: SupportMatrix, threshold: float = SUPPORT_THRESHOLD
                          ) -> float | None:
    """Share of answer sentences supported by at least one context sentence
    (max cos ≥ `threshold`). None when the answer has no sentence or nothing was read."""
    if not support.answer_sentences or not support.context_sentences:
        return None
    return float(np.mean(support.similarity.max(axis=1) >= threshold))


def unsupported_sentence_rate(support: SupportMatrix, threshold: float = SUPPORT_THRESHOLD
                              ) -> float | None:
    """Unsupported sentence rate (ours): share of answer sentences supported by no context
    sentence (max cos < `threshold`), 1 − sentence support rate at the same threshold. Lower
    is better. None when the answer has no sentence or nothing was read."""
    rate = sentence_support_rate(support, threshold)
    return None if rate is None else 1.0 - rate


def context_precision(support: SupportMatrix, threshold: float = SUPPORT_THRESHOLD) -> float | None:
    """Share of the retrieved context actually used: context sentences that support some
    answer sentence (cos ≥ `threshold`) over all context sentences read. None when nothing
    was read or the answer has no sentence."""
    if not support.answer_sentences or not support.context_sentences:
        return None
    return float(np.mean(support.similarity.max(axis=0) >= threshold))


def evidence_noise(question: str, documents: Sequence[Evidence], embed: Embed,
                   threshold: float = NOISE_THRESHOLD) -> float | None:
    """Share of the retrieved context that is noise for the question: context sentences whose
    cosine similarity to the question is below `threshold` (0.3 by default: a sentence-to-
    question cosine runs lower than sentence-to-sentence). Lower is better; evidence filtering
    exists to lower it. None when nothing was read."""
    evidence = context_sentences(documents)
    if not evidence:
        return None
    vectors = _unit_rows(embed([question, *evidence]))
    return float(np.mean(vectors[1:] @ vectors[0] < threshold))


def faithfulness(answer: str, documents: Sequence[Evidence]) -> float | None:
    """Faithfulness as the study defines it: the share of the answer's tokens found in the
    context — its content tokens (lower-cased `\\w+`, stop words dropped) that occur in the
    documents read. None when the answer has no content token or nothing was read."""
    claimed = content_tokens(answer)
    if not claimed or not documents:
        return None
    read: set[str] = set()
    for document in documents:
        read |= content_tokens(_text(document))
    return len(claimed & read) / len(claimed)


def hallucination_rate(answer: str, documents: Sequence[Evidence]) -> float | None:
    """Hallucination rate as the study defines it: 1 − faithfulness, the share of the
    answer's content tokens found nowhere in the documents read. Lower is better. None where
    faithfulness is None."""
    faithful = faithfulness(answer, documents)
    return None if faithful is None else 1.0 - faithful


def lexical_context_use(answer: str, documents: Sequence[Evidence]) -> float | None:
    """Lexical context use (ours): share of the documents read that share at least one
    content token with the answer. None when nothing was read."""
    if not documents:
        return None
    claimed = content_tokens(answer)
    return sum(1 for d in documents if claimed & content_tokens(_text(d))) / len(documents)


def context_precision_gold(documents: Sequence[Document]) -> float | None:
    """Share of the documents read that are gold (`is_gold` True).

    None when no document was read or none carries gold information (`is_gold` None).
    """
    if not documents or all(d.is_gold is None for d in documents):
        return None
    return sum(1 for d in documents if d.is_gold) / len(documents)


def _weighted_mean(values: Mapping[str, float | None], weights: Mapping[str, float]
                   ) -> float | None:
    present = {name: v for name, v in values.items() if v is not None and weights[name] > 0}
    total = sum(weights[name] for name in present)
    if not present or total == 0:
        return None
    return sum(weights[name] * v for name, v in present.items()) / total


def keyword_coverage(answer: str, keywords: Sequence[str]) -> float | None:
    """Share of `keywords` (words or phrases) the answer contains, compared lower-cased on
    whole words. None when there is no keyword."""
    wanted = [k.strip().lower() for k in keywords if k.strip()]
    if not wanted:
        return None
    text = " ".join(_TOKEN.findall(answer.lower()))
    found = sum(1 for k in wanted if re.search(rf"\b{re.escape(' '.join(_TOKEN.findall(k)))}\b",
                                                text))
    return found / len(wanted)


DEFAULT_QUALITY = QualityWeights()


def answer_quality(answer: str, references: str | Sequence[str], embed: Embed,
                   keywords: Sequence[str] | None = None,
                   weights: QualityWeights = DEFAULT_QUALITY) -> float | None:
    """AQS, the answer quality score in [0, 1]: semantic similarity to the reference answer
    plus keyword coverage.

    For each reference: AQS = (0.6·max(0, cos(embed(answer), embed(reference))) + 0.4·keyword
    coverage) / Σ weights. Keywords are the question's own (`keywords`, where the data has
    them), else the reference's content tokens; coverage is left out (weights renormalised)
    when there are none. The best reference counts (answer lists hold aliases). An empty
    answer scores 0.0; None when there is no reference.
    """
    refs = [references] if isinstance(references, str) else list(references)
    refs = [r for r in refs if r.strip()]
    if not refs:
        return None
    if not answer.strip():
        return 0.0
    vectors = _unit_rows(embed([answer, *refs]))
    cosines = np.clip(vectors[1:] @ vectors[0], 0.0, 1.0)
    scores = []
    for cos, reference in zip(cosines, refs, strict=True):
        coverage = keyword_coverage(answer, keywords if keywords else
                                    sorted(content_tokens(reference)))
        scores.append(_weighted_mean({"similarity": float(cos), "keywords": coverage},
                                     asdict(weights)))
    return max(s for s in scores if s is not None)


# The study's Eq. 11 names TAAS's three terms for r(q) = 1 but gives them no weights:
# sieverag weighs them equally.
STUDY_TAAS_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {"quality": 1.0, "faithfulness": 1.0, "hallucination_control": 1.0})


def taas(quality: float | None, retrieved: bool, *, faithfulness: float | None = None,
         hallucination_rate: float | None = None) -> float | None:
    """TAAS, the trust-aware answer score, as the Auto-RAG study defines it (its Eq. 11).

    r(q) = 0 (answered without retrieval): TAAS = AQS — grounding is not applicable, so an
    answer the router rightly kept from retrieval is not penalised for reading nothing.
    r(q) = 1: TAAS combines AQS, faithfulness and hallucination control
    (1 − hallucination rate). The weights were not read from the study (its text was not
    available offline): sieverag weighs the three equally (`STUDY_TAAS_WEIGHTS`):
    TAAS = (AQS + faithfulness + (1 − hallucination rate)) / 3.
    With the study's hallucination rate (1 − faithfulness) the last two terms are equal, so
    token faithfulness weighs 2/3 — the study's definition, kept as it is. A None term is left
    out and the weights renormalised (nothing read, no content token: TAAS = AQS). None when
    AQS is None (no reference). The grounding terms are keyword-only so that a call written
    for `sentence_taas`'s positional terms fails at once.
    """
    if quality is None:
        return None
    if not retrieved:
        return quality
    control = None if hallucination_rate is None else 1.0 - hallucination_rate
    return _weighted_mean({"quality": quality, "faithfulness": faithfulness,
                           "hallucination_control": control}, STUDY_TAAS_WEIGHTS)


DEFAULT_TAAS = TAASWeights()


def sentence_taas(quality: float | None, retrieved: bool, similarity: float | None = None,
                  support: float | None = None, weights: TAASWeights = DEFAULT_TAAS
                  ) -> float | None:
    """Sentence TAAS (ours; sieverag's `taas` before it took the study's definition): TAAS
    with sentence-level grounding terms in place of the study's token ones.

    r(q) = 0: AQS, as TAAS. r(q) = 1: (0.5·AQS + 0.25·sentence similarity + 0.25·sentence
    support rate) / Σ weights of the terms defined (`trust.taas` weights; a None term is left
    out, the weights renormalised). Its two grounding terms are distinct figures, where the
    study's faithfulness and 1 − hallucination rate are one figure twice. Quality weighs
    half: a grounded wrong answer is still wrong. None when AQS is None (no reference).
    """
    if quality is None:
        return None
    if not retrieved:
        return quality
    return _weighted_mean({"quality": quality, "sentence_similarity": similarity,
                           "sentence_support": support}, asdict(weights))


@dataclass(frozen=True)
class TrustReport:
    """All trust metrics of one answer (None where undefined or not applicable)."""

    retrieved: bool
    answer_quality: float | None
    faithfulness: float | None
    hallucination_rate: float | None
    sentence_similarity: float | None
    sentence_support_rate: float | None
    unsupported_sentence_rate: float | None
    context_precision: float | None
    evidence_noise: float | None
    taas: float | None
    sentence_taas: float | None
    lexical_context_use: float | None
    context_precision_gold: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trust_report(question: str, answer: str, documents: Sequence[Document],
                 references: str | Sequence[str], embed: Embed | None,
                 retrieved: bool | None = None, keywords: Sequence[str] | None = None,
                 support_threshold: float = SUPPORT_THRESHOLD,
                 noise_threshold: float = NOISE_THRESHOLD,
                 quality_weights: QualityWeights = DEFAULT_QUALITY,
                 taas_weights: TAASWeights = DEFAULT_TAAS) -> TrustReport:
    """Every trust metric of one answer. `retrieved` is r(q) (default: `documents`, what the
    generator read, is not empty); the grounding metrics are None when it is false, and when
    nothing was read. Without `embed` the embedding metrics are None (the token ones remain:
    faithfulness, hallucination rate, lexical context use). `taas_weights` weigh
    `sentence_taas` (the study's TAAS has fixed weights: `STUDY_TAAS_WEIGHTS`)."""
    retrieved = bool(documents) if retrieved is None else retrieved
    quality = similarity = supported = unsupported = precision = noise = None
    if embed is not None:
        quality = answer_quality(answer, references, embed, keywords, quality_weights)
        if retrieved and documents:
            support = SupportMatrix.of(answer, documents, embed)
            similarity = sentence_similarity(support)
            supported = sentence_support_rate(support, support_threshold)
            unsupported = unsupported_sentence_rate(support, support_threshold)
            precision = context_precision(support, support_threshold)
            noise = evidence_noise(question, documents, embed, noise_threshold)
    # (the token metrics are None when nothing was read)
    faithful = faithfulness(answer, documents) if retrieved else None
    hallucination = hallucination_rate(answer, documents) if retrieved else None
    return TrustReport(
        retrieved=retrieved, answer_quality=quality, faithfulness=faithful,
        hallucination_rate=hallucination, sentence_similarity=similarity,
        sentence_support_rate=supported, unsupported_sentence_rate=unsupported,
        context_precision=precision, evidence_noise=noise,
        taas=taas(quality, retrieved, faithfulness=faithful, hallucination_rate=hallucination),
        sentence_taas=sentence_taas(quality, retrieved, similarity, supported, taas_weights),
        lexical_context_use=lexical_context_use(answer, documents) if retrieved else None,
        context_precision_gold=context_precision_gold(documents),
    )


# --- LLM grader (the study's LLM-as-a-judge) ----------------------------------------------

GRADER_CRITERIA = ("correctness", "relevance", "completeness", "evidence_grounding",
                  "hallucination_risk", "overall")
# Scales of the study: every criterion 1 (worst) to 5 (best) except hallucination risk,
# where 1 is the lowest risk — lower is better there.
LOWER_IS_BETTER = frozenset({"hallucination_risk"})
# Grounding in evidence is not applicable to an answer given without retrieval.
GROUNDING_CRITERIA = frozenset({"evidence_grounding"})
GRADER_PROMPT = "answer_grader"
GRADER_PROMPT_NO_CONTEXT = "answer_grader_no_context"
_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


@dataclass(frozen=True)
class GraderVerdict:
    """Six 1–5 scores as the study defines them: higher is better except for
    `hallucination_risk` (1 = no invented content, 5 = mostly invented); `evidence_grounding`
    is None for an answer given without retrieval (not applicable).

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
        return {name: getattr(self, name) for name in GRADER_CRITERIA}


def grader_criteria(retrieved: bool) -> tuple[str, ...]:
    """The criteria asked of an answer: all six with retrieval, no grounding without."""
    return tuple(c for c in GRADER_CRITERIA if retrieved or c not in GROUNDING_CRITERIA)


def parse_grader_reply(reply: str, retrieved: bool = True) -> GraderVerdict:
    """Parse a grader reply strictly: one JSON object (surrounding text and code fences are
    ignored) holding every criterion asked (`grader_criteria(retrieved)`) as an integer 1–5;
    other keys are ignored (a grounding score given without retrieval too)."""
    match = _JSON_OBJECT.search(reply)
    if match is None:
        return GraderVerdict(error="no JSON object in the reply", raw=reply)
    try:  # any text json cannot read (syntax, huge numbers, deep nesting) is a bad reply
        payload: Any = parse_json(match.group(), "the reply")
    except DatasetError as error:
        return GraderVerdict(error=str(error), raw=reply)
    if not isinstance(payload, dict):
        return GraderVerdict(error="the JSON is not an object", raw=reply)
    asked = grader_criteria(retrieved)
    missing = [name for name in asked if name not in payload]
    if missing:
        return GraderVerdict(error=f"missing score(s): {', '.join(missing)}", raw=reply)
    invalid = [name for name in asked
               if type(payload[name]) is not int or not 1 <= payload[name] <= 5]
    if invalid:
        return GraderVerdict(error=f"score(s) not an integer 1-5: {', '.join(invalid)}",
                            raw=reply)
    return GraderVerdict(**{name: payload[name] for name in asked}, raw=reply)


def _format_documents(documents: Sequence[Evidence]) -> str:
    return "\n\n".join(f"[{i}] {_text(d)}" for i, d in enumerate(documents, start=1))


@dataclass(frozen=True)
class GraderItem:
    """One answer to grade: its question, the reference answer and what the generator read
    (empty: answered without retrieval)."""

    question: str
    answer: str
    reference: str
    documents: Sequence[Evidence] = ()


def grade_answers(backend: LLMBackend, items: Sequence[GraderItem],
                 settings: GenerationSettings = GenerationSettings(max_new_tokens=128)
                 ) -> list[GraderVerdict]:
    """Grade many answers in one batch (see `GraderVerdict`). An answer given without
    retrieval is asked the five criteria that apply (prompt `answer_grader_no_context`).
    An invalid reply yields None scores with the reason in `error`, never an exception;
    backend failures (a server that is down) propagate as the backend raises them."""
    with_context = load_template(GRADER_PROMPT)
    without = load_template(GRADER_PROMPT_NO_CONTEXT)
    prompts = [with_context.messages(question=i.question, answer=i.answer,
                                     reference=i.reference,
                                     documents=_format_documents(i.documents))
               if i.documents else
               without.messages(question=i.question, answer=i.answer, reference=i.reference)
               for i in items]
    replies = backend.generate(prompts, settings, agent="grader") if prompts else []
    return [parse_grader_reply(reply, bool(item.documents))
            for reply, item in zip(replies, items, strict=True)]
