"""The chunk filters `eval-filter` compares, each run over the same questions' passages.

Each method turns every evaluated question's passages into `ChunkDecisions`: a score per
passage (None for methods without one) and the ids of the passages kept.

* `trained filter` — the LoRA filter's verdict: P(Yes) = exp(lp_Yes) / (exp(lp_Yes) +
  exp(lp_No)) from one batched next-token step (`label_logprobs`, the filter contract's
  chunk task); kept when P(Yes) > threshold (0.5: log P(Yes) > log P(No)).
* `MAIN-RAG judge` — `inference.filters.judge.MainRagJudge` on the same base model without
  the adapter: r = log P(Yes) − log P(No) after Agent-1's per-passage answer, kept when
  r ≥ τq = mean(r) − n·σ(r).
* `BM25 top-k`, `dense top-k` — the k passages that score best for the question, with the
  retrieval package's BM25 (bm25s) and its dense encoder (all-MiniLM-L6-v2 cosine).
* `keep all` — every passage.

The trained filter's sentence stage (`filter_sentences`) generates the sentence-task answer
for each chunk and parses it with `parse_sentence_answer`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tqdm.auto import tqdm

from sieverag.inference.filters.filter_format import (
    CHUNK_LABELS,
    FilterAnswerError,
    chunk_prompt,
    p_relevant,
    parse_sentence_answer,
    relevance_log_odds,
    sentence_prompt,
)
from sieverag.inference.filters.judge import judge_bar
from sieverag.inference.llm.base import GenerationSettings, LLMBackend
from sieverag.inference.types import Document, Example

SENTENCE_SETTINGS = GenerationSettings(max_new_tokens=32, stop=("\n",))
_PROMPTS_PER_STEP = 64  # prompts per backend call: a progress tick without losing batching


@dataclass(frozen=True)
class ChunkDecisions:
    """One method's verdict on the passages of every evaluated question."""

    method: str
    kept: dict[str, tuple[str, ...]]
    """Example id → kept passage ids, best first where the method ranks."""
    scores: dict[str, float] | None
    """Passage id → the method's score (higher = more relevant); None: no score."""


@dataclass(frozen=True)
class SentenceAnswer:
    """The filter's sentence-task answer for one passage."""

    kept: tuple[int, ...]
    """0-based key sentence indices; every sentence when the answer did not parse."""
    parsed: bool
    reply: str


def _in_steps(items: Sequence, desc: str, progress: bool) -> Iterator[Sequence]:
    """`items` in slices of _PROMPTS_PER_STEP, with a progress bar ticking per slice."""
    steps = [items[i:i + _PROMPTS_PER_STEP] for i in range(0, len(items), _PROMPTS_PER_STEP)]
    yield from tqdm(steps, desc=desc, unit="step", disable=not progress or len(steps) < 2)


def filter_chunk_scores(backend: LLMBackend, examples: Sequence[Example], *,
                        progress: bool = True) -> dict[str, float]:
    """Passage id → P(Yes) from the trained filter, all passages in batched calls."""
    pairs = [(e, d) for e in examples for d in e.documents]
    scores: dict[str, float] = {}
    for step in _in_steps(pairs, "filter: chunks", progress):
        prompts = [chunk_prompt(e.question, d.text, d.title) for e, d in step]
        logprobs = backend.label_logprobs(prompts, CHUNK_LABELS, agent="filter")
        for (_, document), lp in zip(step, logprobs, strict=True):
            scores[document.id] = p_relevant(relevance_log_odds(lp))
    return scores


def threshold_decisions(method: str, examples: Sequence[Example], scores: dict[str, float],
                        threshold: float) -> ChunkDecisions:
    """Keep the passages scoring above `threshold`, ordered by score."""
    kept = {e.id: tuple(sorted((d.id for d in e.documents if scores[d.id] > threshold),
                               key=lambda i: -scores[i]))
            for e in examples}
    return ChunkDecisions(method, kept, scores)


def top_k_decisions(method: str, examples: Sequence[Example], scores: dict[str, float],
                    k: int) -> ChunkDecisions:
    """Keep each question's k best-scoring passages (ties: the earlier passage)."""
    kept = {}
    for example in examples:
        ranked = sorted(enumerate(example.documents), key=lambda p: (-scores[p[1].id], p[0]))
        kept[example.id] = tuple(d.id for _, d in ranked[:k])
    return ChunkDecisions(method, kept, scores)


def adaptive_decisions(method: str, examples: Sequence[Example], scores: dict[str, float],
                       n: float) -> ChunkDecisions:
    """Keep the passages whose log-odds reach the question's bar mean − n·σ (MCF `adaptive`).

    `scores` are P(Yes); the bar is taken on log(P / (1 − P)) = log P(Yes) − log P(No), the
    score MCF's adaptive bar uses, so both rules keep the same passages."""
    kept = {}
    for example in examples:
        odds = {d.id: _log_odds(scores[d.id]) for d in example.documents}
        bar = judge_bar(list(odds.values()), n)
        kept[example.id] = tuple(sorted((i for i, s in odds.items() if s >= bar),
                                        key=lambda i: -odds[i]))
    return ChunkDecisions(method, kept, scores)


def prior_fused_scores(examples: Sequence[Example], probabilities: dict[str, float],
                       prior: dict[str, float], weight: float) -> dict[str, float]:
    """Per question, MCF's fused score z(log-odds) + weight·z(prior) (`mcf.with_prior`)."""
    from sieverag.inference.filters.mcf import with_prior

    fused = {}
    for example in examples:
        ids = [d.id for d in example.documents]
        values = with_prior([_log_odds(probabilities[i]) for i in ids], [prior[i] for i in ids],
                            weight)
        fused.update(zip(ids, values, strict=True))
    return fused


def _log_odds(probability: float, floor: float = 1e-12) -> float:
    p = min(max(probability, floor), 1 - floor)
    return math.log(p / (1 - p))


def keep_all(examples: Sequence[Example]) -> ChunkDecisions:
    """Every passage kept, in the given order; no score."""
    return ChunkDecisions("keep all", {e.id: tuple(d.id for d in e.documents) for e in examples},
                          None)


def bm25_scores(examples: Sequence[Example]) -> dict[str, float]:
    """Passage id → BM25 score of the passage for its question, among that question's passages."""
    from sieverag.inference.retrieval.bm25 import question_scores

    scores = {}
    for example in examples:
        values = question_scores(example.question, [d.as_context() for d in example.documents])
        for document, score in zip(example.documents, values, strict=True):
            scores[document.id] = score
    return scores


def dense_scores(examples: Sequence[Example], embedding_model: str,
                 device: str = "auto") -> dict[str, float]:
    """Passage id → cosine of question and passage embeddings (unit vectors, dot product)."""
    from sieverag.inference.retrieval.dense import DenseConfig, make_encoder

    encode = make_encoder(DenseConfig(model=embedding_model, device=device))
    questions = encode([e.question for e in examples])
    scores = {}
    for example, question in zip(examples, questions, strict=True):
        passages = encode([d.as_context() for d in example.documents])
        for document, score in zip(example.documents, passages @ question, strict=True):
            scores[document.id] = float(score)
    return scores


def judge_decisions(backend: LLMBackend, examples: Sequence[Example], bar_n: float, *,
                    progress: bool = True) -> ChunkDecisions:
    """The MAIN-RAG judge's keep decisions and scores r, question by question."""
    from sieverag.inference.filters.judge import JudgeConfig, MainRagJudge

    judge = MainRagJudge(backend, JudgeConfig(bar_n=bar_n))
    kept, scores = {}, {}
    for example in tqdm(examples, desc="MAIN-RAG judge", unit="question", disable=not progress):
        result = judge.select(example.question, example.documents)
        kept[example.id] = tuple(s.document.id for s in result.kept)
        scores.update({s.document.id: s.score for s in result.scored})
    return ChunkDecisions("MAIN-RAG judge", kept, scores)


def filter_sentences(backend: LLMBackend, items: Sequence[tuple[Example, Document]], *,
                     progress: bool = True) -> dict[str, SentenceAnswer]:
    """Passage id → the filter's key sentences for each (question, passage with sentences).

    A reply that does not follow the answer format keeps every sentence of its passage (the
    filter then passes the chunk on whole) and counts as unparsed.
    """
    answers: dict[str, SentenceAnswer] = {}
    for step in _in_steps(items, "filter: sentences", progress):
        prompts = [sentence_prompt(e.question, d.sentences or (), d.title) for e, d in step]
        replies = backend.generate(prompts, SENTENCE_SETTINGS, agent="filter")
        for (_, document), reply in zip(step, replies, strict=True):
            answers[document.id] = _parse_sentences(reply, len(document.sentences or ()))
    return answers


def _parse_sentences(reply: str, n_sentences: int) -> SentenceAnswer:
    try:
        return SentenceAnswer(tuple(parse_sentence_answer(reply, n_sentences)), True, reply)
    except FilterAnswerError:
        return SentenceAnswer(tuple(range(n_sentences)), False, reply)

