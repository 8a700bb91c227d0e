"""MCF, Amber's multi-granular content filter, on the trained filter (arXiv 2504.05312).

Two stages, both in the trained filter's contract (`inference/filters/filter_format.py`),
so any backend serving the filter works: `hf` with the LoRA adapter in-process, or `openai`
against a server that serves the adapter.

* Chunk stage: one batched `label_logprobs` call over the round's chunks; a chunk's score is
  s = log P("Yes") − log P("No"). A chunk is kept when s ≥ the bar: the k best chunks of
  the round (`top_k`, a fixed reading budget; the default, k = 2), a fixed threshold (0: the
  filter finds "Yes" at least as likely as "No"; the only bar that can reject a whole round
  of noise), or MAIN-RAG's adaptive bar τ = mean(s) − n·σ(s) over the round's chunks
  (`judge_bar`). Kept chunks are ordered by s, best first.
  With `lexical_weight` w > 0 (the default, 1) s becomes z(s) + w·z(BM25), z over the
  round's chunks: the filter's judgement fused with how well each chunk matches the
  question's words (it scored best on held-out HotpotQA; README "Measured results").
* Sentence stage (off by default: whole chunks answered better on HotpotQA; turn it on
  with `sentence_stage`): one batched generation over the kept chunks that have more than one
  sentence; the reply ("1, 3" / "none") is parsed with `parse_sentence_answer`. A kept
  chunk's text becomes its key sentences in their original order; its id, title and gold flag
  stay. A reply that does not parse keeps the whole chunk; a "none" reply keeps the whole
  chunk or drops it (`empty_sentence_answer`). Sentences are the data's own split
  (`Document.sentences`, blank entries left out) where it has one, else `split_sentences`.
  Every decision is recorded in the scored document's `details`; its `key_sentences` index
  the numbered sentences (`source_positions` maps them to the data's split).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field, replace
from typing import Literal

from sieverag.inference.errors import ConfigError
from sieverag.inference.filters.base import FilterResult, ScoredDocument, z_scores
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
from sieverag.inference.retrieval.sentences import split_sentences
from sieverag.inference.settings import Section, settings
from sieverag.inference.types import Document

ChunkBar = Literal["fixed", "adaptive", "top_k"]
EmptySentenceAnswer = Literal["keep_chunk", "drop_chunk"]
DEFAULT_LEXICAL_WEIGHT = 1.0


@settings
class MCFConfig:
    """The MCF filter's rules: the chunk bar and the sentence stage. Which model and adapter
    run it is the run's filter role (`models.filter`)."""

    # Defaults: the chunk rule that measured best on held-out HotpotQA (README "Measured
    # results"): the filter's 2 best chunks of a round, its score fused with BM25.
    bar: ChunkBar = field(default="top_k", metadata={
        "help": "fixed: keep s >= threshold; adaptive: keep s >= mean(s) - bar_n·std(s); "
                "top_k: keep the top_k best-scoring chunks of the round"})
    threshold: float = field(default=0.0, metadata={
        "help": "fixed bar on s = log P(Yes) - log P(No); 0 keeps P(Yes) >= P(No)"})
    bar_n: float = field(default=0.0, metadata={"help": "n of the adaptive bar"})
    top_k: int = field(default=2, metadata={"help": "chunks kept per round by the top_k bar"})
    lexical_weight: float | None = field(default=None, metadata={
        "help": "w of a lexical prior: a chunk's score becomes z(s) + w·z(BM25 of the question "
                "against the round's chunks), z over the round; 0 ranks by the filter alone. "
                "Only under the adaptive or top_k bar; default: 1 under those, off under fixed"})
    sentence_stage: bool = field(default=False, metadata={
        "help": "narrow kept chunks to their key sentences"})
    sentence_max_new_tokens: int = field(default=16, metadata={
        "help": "length cap of the sentence-number reply"})
    empty_sentence_answer: EmptySentenceAnswer = field(default="keep_chunk", metadata={
        "help": "a kept chunk whose sentence reply is 'none': keep_chunk (the chunk stage "
                "decides relevance) or drop_chunk"})

    @property
    def prior_weight(self) -> float:
        """The lexical prior's weight in use: as given, else 1 under a relative bar, else 0."""
        if self.lexical_weight is not None:
            return self.lexical_weight
        return 0.0 if self.bar == "fixed" else DEFAULT_LEXICAL_WEIGHT

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ConfigError(f"mcf.top_k must be >= 1, got {self.top_k}")
        if self.lexical_weight is not None and self.lexical_weight < 0:
            raise ConfigError(f"mcf.lexical_weight must be >= 0, got {self.lexical_weight}")
        if self.lexical_weight and self.bar == "fixed":
            raise ConfigError("mcf.lexical_weight needs bar adaptive or top_k: a fused score "
                              "is relative to the round, a fixed threshold on it means nothing")
        if self.sentence_max_new_tokens < 1:
            raise ConfigError(f"mcf.sentence_max_new_tokens must be >= 1, got "
                              f"{self.sentence_max_new_tokens}")


def with_prior(scores: Sequence[float], prior: Sequence[float], weight: float) -> list[float]:
    """z(scores) + weight·z(prior), both z-normalised over the same chunks."""
    return [s + weight * p for s, p in zip(z_scores(scores), z_scores(prior), strict=True)]


def document_sentences(document: Document) -> list[str]:
    """The sentences MCF numbers: the data's own split where it has one (blank entries left
    out), else split_sentences of the text."""
    if document.sentences:
        return [document.sentences[i] for i in source_positions(document)]
    return split_sentences(document.text)


def source_positions(document: Document) -> list[int]:
    """Where each of `document_sentences(document)` sits in the data's split
    (`document.sentences`, whose indices `supporting_sentences` uses); for a text without a
    split, its own index."""
    if document.sentences:
        return [i for i, sentence in enumerate(document.sentences) if sentence.strip()]
    return list(range(len(split_sentences(document.text))))


def narrowed(document: Document, sentences: Sequence[str], keep: Sequence[int]) -> Document:
    """`document` reduced to `sentences[i]` for i in `keep` (increasing; `sentences` is
    `document_sentences(document)`), ids and flags kept.

    Gold key-sentence indices are renumbered to positions within the kept sentences.
    """
    kept = tuple(sentences[i].strip() for i in keep)
    gold = None
    if document.supporting_sentences is not None:
        positions = source_positions(document)
        gold = tuple(pos for pos, i in enumerate(keep)
                     if positions[i] in document.supporting_sentences)
    return replace(document, text=" ".join(kept), sentences=kept, supporting_sentences=gold)


MCF_SECTION = Section("mcf", MCFConfig, "the trained filter's (MCF's) rules")


class MultiGranularFilter:
    """The `mcf` filter: chunk stage, then sentence stage, on the trained filter's backend."""

    name = "mcf"

    def __init__(self, backend: LLMBackend, config: MCFConfig | None = None) -> None:
        self.backend = backend
        self.config = config if config is not None else MCFConfig()

    def chunk_scores(self, question: str, documents: Sequence[Document]) -> list[dict]:
        """s = log P("Yes") − log P("No") per document, with P("Yes") normalised over the two
        labels, from one batched label_logprobs call (agent `filter_chunk`)."""
        prompts = [chunk_prompt(question, d.text, d.title) for d in documents]
        logprobs = self.backend.label_logprobs(prompts, CHUNK_LABELS, agent="filter_chunk")
        scores = [relevance_log_odds(lp) for lp in logprobs]
        return [{"score": score, "p_yes": p_relevant(score)} for score in scores]

    def chunk_stage(self, question: str, documents: Sequence[Document]) -> FilterResult:
        """Score every document and keep those at or above the bar, best first (full text)."""
        if not documents:
            return FilterResult(kept=(), scored=(), threshold=None)
        return self.chunk_verdicts(question, documents, self.chunk_scores(question, documents))

    def chunk_verdicts(self, question: str, documents: Sequence[Document],
                       scores: Sequence[dict]) -> FilterResult:
        """The chunk stage's verdicts on `documents` (at least one) from their `chunk_scores`:
        the lexical prior fused in where configured, the bar applied, kept ones best first."""
        values = [s["score"] for s in scores]
        details = [{"p_yes": round(s["p_yes"], 4)} for s in scores]
        if self.config.prior_weight > 0:
            from sieverag.inference.retrieval.bm25 import question_scores

            lexical = question_scores(question, [d.as_context() for d in documents])
            for detail, score, bm25 in zip(details, values, lexical, strict=True):
                detail.update(filter_score=round(score, 4), bm25=round(bm25, 4))
            values = with_prior(values, lexical, self.config.prior_weight)
        bar = self.bar(values)
        scored = tuple(ScoredDocument(d, value, value >= bar, detail)
                       for d, value, detail in zip(documents, values, details, strict=True))
        kept = tuple(sorted((s for s in scored if s.kept), key=lambda s: -s.score))
        return FilterResult(kept=kept, scored=scored, threshold=bar)

    def bar(self, scores: Sequence[float]) -> float:
        """The round's bar on s. top_k: the k-th best score (ties at it are kept too)."""
        if self.config.bar == "fixed":
            return self.config.threshold
        if self.config.bar == "adaptive":
            return judge_bar(scores, self.config.bar_n)
        return sorted(scores, reverse=True)[min(self.config.top_k, len(scores)) - 1]

    def sentence_stage(self, question: str,
                       kept: Sequence[ScoredDocument]) -> list[ScoredDocument]:
        """Each kept chunk narrowed to its key sentences (same order) from one batched
        generation (agent `filter_sentence`); a chunk dropped on a "none" reply under
        `drop_chunk` comes back with kept=False."""
        sentences = [document_sentences(s.document) for s in kept]
        asked = [i for i, sents in enumerate(sentences) if len(sents) > 1]
        replies: dict[int, str] = {}
        if asked:
            prompts = [sentence_prompt(question, sentences[i], kept[i].document.title)
                       for i in asked]
            settings = GenerationSettings(max_new_tokens=self.config.sentence_max_new_tokens,
                                          stop=("\n",))
            answers = self.backend.generate(prompts, settings, agent="filter_sentence")
            replies = dict(zip(asked, answers, strict=True))
        return [self._narrow(scored, sentences[i], replies.get(i))
                for i, scored in enumerate(kept)]

    def _narrow(self, scored: ScoredDocument, sentences: list[str],
                reply: str | None) -> ScoredDocument:
        every = list(range(len(sentences)))
        if reply is None:  # one sentence: nothing to choose, no call made
            return replace(scored, details={**scored.details, "sentence_status": "single",
                                            "key_sentences": every})
        details = {**scored.details, "sentence_reply": reply}
        try:
            keys = parse_sentence_answer(reply, len(sentences))
        except FilterAnswerError:
            return replace(scored, details={**details, "sentence_status": "unparsed",
                                            "key_sentences": every})
        if not keys:
            if self.config.empty_sentence_answer == "drop_chunk":
                return replace(scored, kept=False,
                               details={**details, "sentence_status": "none_dropped",
                                        "key_sentences": []})
            return replace(scored, details={**details, "sentence_status": "none",
                                            "key_sentences": every})
        return replace(scored, document=narrowed(scored.document, sentences, keys),
                       details={**details, "sentence_status": "parsed", "key_sentences": keys})

    def select(self, question: str, documents: Sequence[Document]) -> FilterResult:
        chunks = self.chunk_stage(question, documents)
        if not self.config.sentence_stage or not chunks.kept:
            return chunks
        return self.narrow(question, chunks)

    def narrow(self, question: str, chunks: FilterResult) -> FilterResult:
        """The chunk-stage result with its kept chunks passed through the sentence stage."""
        staged = {s.document.id: s for s in self.sentence_stage(question, chunks.kept)}
        kept = tuple(staged[s.document.id] for s in chunks.kept if staged[s.document.id].kept)
        scored = tuple(staged.get(s.document.id, s) for s in chunks.scored)
        return FilterResult(kept=kept, scored=scored, threshold=chunks.threshold)
