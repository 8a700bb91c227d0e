"""Trust-aware answer metrics: the Auto-RAG nutrition study's, under its names, and our own
variants, under names of their own. Every trust metric is defined here; `eval` computes and
reports them.

Every metric is a pure function of the question, the answer, the retrieved context the
generator read (documents, i.e. the study's chunks d_j; their sentences) and, where needed, a
sentence encoder `embed(texts) -> array (len(texts), dim)` (any encoder; tests pass a fake).
r(q) is whether the answer was produced with retrieval: `auto`'s routing decision where it
routed, else 1 when the generator read retrieved context; 0 when the model answered alone
(`direct`, or `auto` routing to the model). Grounding needs context: a question that
retrieved and read nothing has no grounding figures either.

The study's metrics, as its text defines them: AQS (`answer_quality`), TAAS (`taas`, its
Eq. 11: AQS alone without retrieval, 0.4·AQS + 0.6·faithfulness with it), `faithfulness`
(share of the answer's content tokens found in the context), `hallucination_rate`
(1 − faithfulness), `context_precision` (token-level: share of the context's content tokens
the answer uses), `evidence_noise` (1 − context precision), `sentence_support_rate` (SSR /
SAEA: share of answer sentences some retrieved chunk supports, Sim(s_i, d_j) ≥ τ), and the
six-criterion LLM grader (`grader`).
Ours, named for what they compute: `sentence_taas` (TAAS over sentence-level grounding
terms), `sentence_similarity` (mean best cosine of the answer's sentences to the context's),
`sentence_support_by_sentence` (support against context *sentences*, not chunks),
`unsupported_sentence_rate` (1 − it), `sentence_context_precision` (context sentences that
support an answer sentence), `sentence_evidence_noise` (context sentences off the question),
`lexical_context_use` and `context_precision_gold`.

Grounding metrics (all but AQS, the two TAAS and the gold context precision) are not
applicable when r(q) = 0: they are None in the record and left out of the means, which say
how many answers they cover. An answer with no sentence (or no content token), a metric with
no input (no reference, no context sentence) is None too, never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import reads_old_keys, settings
from sieverag.inference.core.types import Document
from sieverag.inference.retrieval.sentences import split_sentences

# The study's Eq. 14 names its alignment threshold τ but the text gives no value: sieverag
# keeps the cosine its own sentence support uses.
ALIGNMENT_THRESHOLD = 0.5  # τ: cosine at which a retrieved chunk supports an answer sentence
SUPPORT_THRESHOLD = 0.5  # cosine at which a context sentence supports an answer sentence
NOISE_THRESHOLD = 0.3  # cosine to the question under which a context sentence is noise


def _check_weights(name: str, weights: dict[str, float]) -> None:
    if any(v < 0 for v in weights.values()) or sum(weights.values()) == 0:
        raise ConfigError(f"{name} weights must be >= 0 and not all 0, got {weights}")


@settings
class QualityWeights:
    """Weights of the answer quality score (AQS)."""

    similarity: float = field(default=0.6, metadata={
        "help": "weight of embedding similarity to the reference"})
    keywords: float = field(default=0.4, metadata={"help": "weight of keyword coverage"})

    def __post_init__(self) -> None:
        _check_weights("trust.quality", asdict(self))


# TAAS weights' keys before the trust metrics took the Auto-RAG study's names
# (docs/compatibility.md): a config.yaml of an older run still reads.
_OLD_TAAS_KEYS = {"faithfulness": "sentence_similarity", "grounding": "sentence_support"}


@settings
class TAASWeights:
    """Weights of sentence TAAS (`sentence_taas`, ours) when the answer retrieved (r(q) = 1);
    the study's TAAS has fixed weights (`STUDY_TAAS_WEIGHTS`). The old keys `faithfulness` and
    `grounding` are read as `sentence_similarity` and `sentence_support`."""

    quality: float = field(default=0.5, metadata={"help": "weight of AQS"})
    sentence_similarity: float = field(default=0.25, metadata={
        "help": "weight of sentence similarity (the answer sentences' mean best cosine to "
                "the context)"})
    sentence_support: float = field(default=0.25, metadata={
        "help": "weight of sentence support by sentence (1 − unsupported sentence rate)"})

    _read_old_keys = reads_old_keys(_OLD_TAAS_KEYS)

    def __post_init__(self) -> None:
        _check_weights("trust.taas", asdict(self))


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


def sentence_support_by_sentence(support: SupportMatrix, threshold: float = SUPPORT_THRESHOLD
                                 ) -> float | None:
    """Sentence support by sentence (ours): share of answer sentences supported by at least
    one context *sentence* (max cos ≥ `threshold`); the study's `sentence_support_rate`
    compares them with whole retrieved chunks. None when the answer has no sentence or
    nothing was read."""
    if not support.answer_sentences or not support.context_sentences:
        return None
    return float(np.mean(support.similarity.max(axis=1) >= threshold))


def unsupported_sentence_rate(support: SupportMatrix, threshold: float = SUPPORT_THRESHOLD
                              ) -> float | None:
    """Unsupported sentence rate (ours): share of answer sentences supported by no context
    sentence (max cos < `threshold`), 1 − sentence support by sentence at the same threshold.
    Lower is better. None when the answer has no sentence or nothing was read."""
    rate = sentence_support_by_sentence(support, threshold)
    return None if rate is None else 1.0 - rate


def sentence_context_precision(support: SupportMatrix, threshold: float = SUPPORT_THRESHOLD
                               ) -> float | None:
    """Sentence context precision (ours): context sentences that support some answer sentence
    (cos ≥ `threshold`) over all context sentences read; the study's `context_precision` is
    token-level. None when nothing was read or the answer has no sentence."""
    if not support.answer_sentences or not support.context_sentences:
        return None
    return float(np.mean(support.similarity.max(axis=0) >= threshold))


def sentence_evidence_noise(question: str, documents: Sequence[Evidence], embed: Embed,
                            threshold: float = NOISE_THRESHOLD) -> float | None:
    """Sentence evidence noise (ours): share of the context sentences read whose cosine
    similarity to the question is below `threshold` (0.3 by default: a sentence-to-question
    cosine runs lower than sentence-to-sentence); the study's `evidence_noise` is read from
    its token-level context precision. Lower is better. None when nothing was read."""
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
    return len(claimed & _context_tokens(documents)) / len(claimed)


def hallucination_rate(answer: str, documents: Sequence[Evidence]) -> float | None:
    """Hallucination rate as the study defines it: 1 − faithfulness, the share of the
    answer's content tokens found nowhere in the documents read. Lower is better. None where
    faithfulness is None."""
    faithful = faithfulness(answer, documents)
    return None if faithful is None else 1.0 - faithful


def _context_tokens(documents: Sequence[Evidence]) -> set[str]:
    read: set[str] = set()
    for document in documents:
        read |= content_tokens(_text(document))
    return read


def context_precision(answer: str, documents: Sequence[Evidence]) -> float | None:
    """Context precision as the study defines it (its Eq. 12, a token-level metric): the share
    of the retrieved context actually used to build the answer — the context's distinct
    content tokens (lower-cased `\\w+`, stop words dropped) that the answer uses, over all the
    context's content tokens. Small means much of what was read went unused. None when
    nothing was read (or what was read has no content token)."""
    read = _context_tokens(documents)
    if not read:
        return None
    return len(content_tokens(answer) & read) / len(read)


def evidence_noise(answer: str, documents: Sequence[Evidence]) -> float | None:
    """Evidence noise as the study reads it from context precision: 1 − context precision,
    the share of the context's content tokens the answer does not use. Lower is better. None
    where context precision is None."""
    precision = context_precision(answer, documents)
    return None if precision is None else 1.0 - precision


def sentence_support_rate(answer: str, documents: Sequence[Evidence], embed: Embed,
                          threshold: float = ALIGNMENT_THRESHOLD) -> float | None:
    """The study's sentence support rate (SSR; its sentence-level answer-evidence alignment,
    SAEA, Eq. 14): the share of answer sentences s_i that at least one retrieved chunk d_j
    supports, Sim(s_i, d_j) = cos(embed(s_i), embed(d_j)) ≥ τ (`threshold`). Each document read
    is one chunk, embedded whole. None when the answer has no sentence or nothing was read."""
    claims = split_sentences(answer)
    chunks = [_text(d) for d in documents if _text(d).strip()]
    if not claims or not chunks:
        return None
    vectors = _unit_rows(embed([*claims, *chunks]))
    similarity = vectors[: len(claims)] @ vectors[len(claims):].T
    return float(np.mean(similarity.max(axis=1) >= threshold))


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


# The study's weights for r(q) = 1, as its reported rows fix them (each (AQS, faithfulness)
# → TAAS pair it prints, e.g. (0.857, 0.327) → 0.539): 0.4·AQS + 0.3·F + 0.3·(1 − H).
STUDY_TAAS_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {"quality": 0.4, "faithfulness": 0.3, "hallucination_control": 0.3})


def taas(quality: float | None, retrieved: bool, *, faithfulness: float | None = None,
         hallucination_rate: float | None = None) -> float | None:
    """TAAS, the trust-aware answer score, as the Auto-RAG study defines it (its Eq. 11).

    r(q) = 0 (answered without retrieval): TAAS = AQS — grounding is not applicable, so an
    answer the router rightly kept from retrieval is not penalised for reading nothing.
    r(q) = 1: TAAS = 0.4·AQS + 0.3·faithfulness + 0.3·(1 − hallucination rate)
    (`STUDY_TAAS_WEIGHTS`), which with the study's hallucination rate (1 − faithfulness) is
    0.4·AQS + 0.6·faithfulness: the weights its reported rows fix (every (AQS, faithfulness)
    → TAAS pair it prints is reproduced within 0.001). A None term is left out and the weights
    renormalised (nothing read, no content token: TAAS = AQS). None when AQS is None (no
    reference). The grounding terms are keyword-only so that a call written for
    `sentence_taas`'s positional terms fails at once.
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
    support by sentence) / Σ weights of the terms defined (`trust.taas` weights; a None term
    is left out, the weights renormalised). Its two grounding terms are distinct figures,
    where the study's faithfulness and 1 − hallucination rate are one figure twice. Quality weighs
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
    context_precision: float | None
    evidence_noise: float | None
    sentence_support_rate: float | None
    taas: float | None
    sentence_taas: float | None
    sentence_similarity: float | None
    sentence_support_by_sentence: float | None
    unsupported_sentence_rate: float | None
    sentence_context_precision: float | None
    sentence_evidence_noise: float | None
    lexical_context_use: float | None
    context_precision_gold: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def trust_report(question: str, answer: str, documents: Sequence[Document],
                 references: str | Sequence[str], embed: Embed | None,
                 retrieved: bool | None = None, keywords: Sequence[str] | None = None,
                 support_threshold: float = SUPPORT_THRESHOLD,
                 noise_threshold: float = NOISE_THRESHOLD,
                 alignment_threshold: float = ALIGNMENT_THRESHOLD,
                 quality_weights: QualityWeights = DEFAULT_QUALITY,
                 taas_weights: TAASWeights = DEFAULT_TAAS) -> TrustReport:
    """Every trust metric of one answer. `retrieved` is r(q) (default: `documents`, what the
    generator read, is not empty); the grounding metrics are None when it is false, and when
    nothing was read. Without `embed` the embedding metrics are None (the token ones remain:
    faithfulness, hallucination rate, context precision, evidence noise, lexical context
    use). `alignment_threshold` is the study's τ (chunk support), `support_threshold` ours
    (sentence support); `taas_weights` weigh `sentence_taas` (the study's TAAS has fixed
    weights: `STUDY_TAAS_WEIGHTS`)."""
    retrieved = bool(documents) if retrieved is None else retrieved
    grounded = retrieved and bool(documents)
    quality = similarity = by_sentence = unsupported = aligned = None
    sentence_precision = sentence_noise = None
    if embed is not None:
        quality = answer_quality(answer, references, embed, keywords, quality_weights)
        if grounded:
            support = SupportMatrix.of(answer, documents, embed)
            similarity = sentence_similarity(support)
            by_sentence = sentence_support_by_sentence(support, support_threshold)
            unsupported = unsupported_sentence_rate(support, support_threshold)
            sentence_precision = sentence_context_precision(support, support_threshold)
            sentence_noise = sentence_evidence_noise(question, documents, embed,
                                                     noise_threshold)
            aligned = sentence_support_rate(answer, documents, embed, alignment_threshold)
    # (the token metrics are None when nothing was read)
    faithful = faithfulness(answer, documents) if retrieved else None
    hallucination = hallucination_rate(answer, documents) if retrieved else None
    return TrustReport(
        retrieved=retrieved, answer_quality=quality, faithfulness=faithful,
        hallucination_rate=hallucination,
        context_precision=context_precision(answer, documents) if retrieved else None,
        evidence_noise=evidence_noise(answer, documents) if retrieved else None,
        sentence_support_rate=aligned,
        taas=taas(quality, retrieved, faithfulness=faithful, hallucination_rate=hallucination),
        sentence_taas=sentence_taas(quality, retrieved, similarity, by_sentence, taas_weights),
        sentence_similarity=similarity, sentence_support_by_sentence=by_sentence,
        unsupported_sentence_rate=unsupported, sentence_context_precision=sentence_precision,
        sentence_evidence_noise=sentence_noise,
        lexical_context_use=lexical_context_use(answer, documents) if retrieved else None,
        context_precision_gold=context_precision_gold(documents),
    )
