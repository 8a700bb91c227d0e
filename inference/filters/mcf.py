"""MCF, Amber's multi-granular content filter, on the trained filter (arXiv 2504.05312).

Two stages, both in the trained filter's contract (`inference/filters/filter_format.py`),
so any backend serving the filter works: `hf` with the LoRA adapter in-process, or `openai`
against a server that serves the adapter. A one-pass filter (its card's `filter_format`)
reads both granularities in one forward pass per chunk (`marked_label_logprobs`): the chunk
stage gets each sentence's s with the chunk's, and its sentence stage only applies
`sentence_p_min` to them, with no second call. A two-stage filter runs as below.

* Chunk stage: one batched `label_logprobs` call over the round's chunks; the filter's
  s = log P("Yes") − log P("No"). A chunk's score is, by default, the combined logit of
  `inference/filters/card/combination.py`: s with the BM25 and dense scores of the round's chunks,
  weighted as fitted on held-out questions and stored in the filter's card (a card without a
  fit: s alone, `FILTER_ALONE`; no card: z(BM25) + z(dense), `PRIORS_ONLY`); its
  P(relevant) (calibrated where fitted) is in every chunk's details. `lexical_weight` 0
  scores by s alone, w > 0 by z(s) + w·z(BM25)
  (the earlier fixed fusion). A chunk is kept when its score ≥ the bar: by default the
  calibrated bar (keep P(relevant) ≥ `p_min`, default the card's fitted bar, and at least the
  `min_keep` best: a round where several chunks answer keeps them all, and none is emptied
  unless `min_keep` is 0; without a fitted combination it is the top_k bar); the k best
  chunks of the round (`top_k`); a fixed threshold on s (0: the filter finds "Yes" at least
  as likely as "No"); or MAIN-RAG's adaptive bar τ = mean − n·σ over the round's scores
  (`judge_bar`). Kept chunks are ordered by score, best first.
* Sentence stage (off by default: whole chunks answered better on HotpotQA; turn it on
  with `sentence_stage`): one batched generation over the kept chunks that have more than one
  sentence; the reply ("1, 3" / "none") is parsed with `parse_sentence_answer`. A kept
  chunk's text becomes its key sentences in their original order; its id, title and gold flag
  stay. A reply that does not parse keeps the whole chunk; a "none" reply keeps the whole
  chunk or drops it (`empty_sentence_answer`). Sentences are the data's own split
  (`Document.sentences`, blank entries left out) where it has one, else `split_sentences`.
  Every decision is recorded in the scored document's `details`; its `key_sentences` index
  the numbered sentences (`source_positions` maps them to the data's split). Under
  `sentence_rule` priors the filter is not asked: each sentence's BM25 and dense scores and
  its place in the chunk decide (`inference/filters/sentence_priors.py`).
* Long documents: one longer than the filter's window (its card's training length) is read
  window by window, at most `max_windows_per_doc` windows, and judged by its best
  (`inference/filters/windows.py`); a blank document is not read (P(relevant) 0, not kept).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import field, replace
from typing import Literal

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import Section, at_least, settings
from sieverag.inference.core.types import Conversation, Document
from sieverag.inference.filters.adapter_files import AdapterError
from sieverag.inference.filters.card.combination import (
    DEFAULT_P_MIN,
    PRIORS_ONLY,
    Combination,
    RoundBar,
    RoundScores,
    passage_priors,
)
from sieverag.inference.filters.document_filter import FilterResult, ScoredDocument, z_scores
from sieverag.inference.filters.embeddings import round_vectors
from sieverag.inference.filters.filter_format import (
    CHUNK_LABELS,
    FilterAnswerError,
    chunk_prompt,
    p_relevant,
    parse_sentence_answer,
    passage_prompt,
    passage_verdicts,
    relevance_log_odds,
    sentence_prompt,
)
from sieverag.inference.filters.home import (
    HomeDecision,
    HomeMode,
    HomeRule,
    RoundVectors,
    dataset_decision,
    home_reading,
)
from sieverag.inference.filters.judge import judge_bar
from sieverag.inference.filters.sentence_priors import (
    DEFAULT_SENTENCE_BAR,
    fused_sentence_scores,
    prior_key_sentences,
)
from sieverag.inference.filters.windows import (
    DEFAULT_MAX_WINDOWS,
    DEFAULT_WINDOW_TOKENS,
    WindowedRound,
    WindowRule,
    token_offsets_of,
)
from sieverag.inference.llm.backend_protocol import GenerationSettings, LLMBackend
from sieverag.inference.retrieval.sentences import split_sentences

ChunkBar = Literal["calibrated", "top_k", "fixed", "adaptive"]
ScoreRule = Literal["combined", "filter", "fused"]
CardFit = Literal["card", "priors_only"]
EmptySentenceAnswer = Literal["keep_chunk", "drop_chunk"]
SentenceRule = Literal["filter", "priors"]
DEFAULT_LEXICAL_WEIGHT = 1.0
# question, passage texts, embedding model → (BM25, dense cosine) per passage
PriorScorer = Callable[[str, Sequence[str], str],
                       tuple[Sequence[float], Sequence[float]]]


@settings
class MCFConfig:
    """The MCF filter's rules: the chunk bar and the sentence stage. Which model and adapter
    run it is the run's filter role (`models.filter`)."""

    # Defaults: the filter's card's combination of its score with BM25 and dense, and a bar
    # on its calibrated P(relevant) that keeps every chunk above it and never empties a round.
    bar: ChunkBar = field(default="calibrated", metadata={
        "help": "calibrated: keep P(relevant) >= p_min and at least the min_keep best (when "
                "the score is the card's fitted combination, else top_k); top_k: keep the "
                "top_k best-scoring chunks of the round; fixed: keep s >= threshold; "
                "adaptive: keep score >= mean - bar_n·std over the round"})
    p_min: float | None = field(default=None, metadata={
        "help": "P(relevant) bar of the calibrated bar; default: the bar the card's "
                f"combination was fitted with, else {DEFAULT_P_MIN}"})
    min_keep: int | None = field(default=None, metadata={
        "help": "chunks the calibrated bar keeps at least (the best); 0 lets it empty a round; "
                "default: the card's combination's (chosen with its bar), else 1"})
    shift_guard: bool = field(default=True, metadata={
        "help": "where the card's combination has a shift guard and a round's scores are "
                "unlike those its bar was fitted on, keep at least the card's top_k (what "
                "retrieval's top-k keeps); false: the calibrated bar alone"})
    threshold: float = field(default=0.0, metadata={
        "help": "fixed bar on s = log P(Yes) - log P(No); 0 keeps P(Yes) >= P(No)"})
    bar_n: float = field(default=0.0, metadata={"help": "n of the adaptive bar"})
    top_k: int = field(default=2, metadata={
        "help": "chunks kept per round by the top_k bar (and by the calibrated bar without a "
                "fitted combination)"})
    lexical_weight: float | None = field(default=None, metadata={
        "help": "unset: a chunk's score is the card's combination of s with BM25 and dense "
                "(`sieverag filter list` shows it; under the fixed bar, s alone); 0: s alone; "
                "w > 0: z(s) + w·z(BM25), z over the round (the earlier fixed fusion; bar "
                "adaptive or top_k)"})
    combination: CardFit = field(default="card", metadata={
        "help": "card: the card's combination (the filter with BM25 and dense where it adds "
                "to them); priors_only: the card's fit of BM25 and dense alone, with its own "
                "bar (what the filter adds is the difference)"})
    sentence_stage: bool = field(default=False, metadata={
        "help": "narrow kept chunks to their key sentences (a one-pass filter: those its "
                "one pass scored at or above sentence_p_min; a two-stage filter: a second, "
                "generating pass; or by sentence_rule)"})
    sentence_rule: SentenceRule = field(default="filter", metadata={
        "help": "who names the key sentences: filter (as sentence_stage says) or priors "
                "(z(BM25) + z(dense) over the chunk's sentences, at least sentence_min_keep "
                "kept, the rest at sentence_bar; no filter call)"})
    sentence_bar: float = field(default=DEFAULT_SENTENCE_BAR, metadata={
        "help": "the priors rule's bar on a sentence's fused score (z units over its chunk)"})
    sentence_p_min: float = field(default=0.5, metadata={
        "help": "a one-pass filter's sentence bar: keep the kept chunks' sentences whose "
                "P(relevant) is at least this"})
    sentence_min_keep: int = field(default=1, metadata={
        "help": "a one-pass filter or the priors rule keeps at least this many sentences of "
                "each kept chunk (its best); 0: only those at sentence_p_min (sentence_bar) (a "
                "chunk with none is whole, or dropped under empty_sentence_answer=drop_chunk)"})
    sentence_max_new_tokens: int = field(default=16, metadata={
        "help": "length cap of the sentence-number reply"})
    empty_sentence_answer: EmptySentenceAnswer = field(default="keep_chunk", metadata={
        "help": "a kept chunk whose sentence reply is 'none': keep_chunk (the chunk stage "
                "decides relevance) or drop_chunk"})
    max_windows_per_doc: int = field(default=DEFAULT_MAX_WINDOWS, metadata={
        "help": "a document longer than the filter's window is read in at most this many "
                "windows, those BM25 + dense rank best, and judged by its best (as Cohere's "
                "max_chunks_per_doc)"})
    always_score_chunks: bool = field(default=False, metadata={
        "help": "call the filter on every chunk even where the chunk score does not read it "
                "(the card's combination leaves the filter out): the records then show its s "
                "and P(Yes); off: such rounds make no filter call for chunks"})
    window_tokens: int | None = field(default=None, metadata={
        "help": "tokens of text in a window; default: the filter card's (its training "
                f"records' length), else {DEFAULT_WINDOW_TOKENS}"})
    home: HomeMode = field(default="auto", metadata={
        "help": "where the card has a home rule (the filter's own kind of text): auto tests "
                "each round on retrieval's features and ranks a round that looks like home "
                "by the home combination (the filter's score read on the priors' best "
                "passages), every other by the away default; home: every round is home; "
                "away: none is"})

    @property
    def score_rule(self) -> ScoreRule:
        """What a chunk's score is: the card's combination (lexical_weight unset, bar not
        fixed), the filter's s alone, or s fused with BM25 by lexical_weight."""
        if self.lexical_weight is None:
            return "filter" if self.bar == "fixed" else "combined"
        return "fused" if self.lexical_weight > 0 else "filter"

    @property
    def prior_weight(self) -> float:
        """The weight of the fixed BM25 fusion in use (0 unless lexical_weight > 0)."""
        return self.lexical_weight or 0.0

    def __post_init__(self) -> None:
        at_least(1, "mcf.", top_k=self.top_k, sentence_max_new_tokens=self.sentence_max_new_tokens,
                 max_windows_per_doc=self.max_windows_per_doc, window_tokens=self.window_tokens)
        at_least(0, "mcf.", min_keep=self.min_keep, lexical_weight=self.lexical_weight,
                 sentence_min_keep=self.sentence_min_keep)
        if self.p_min is not None and not 0.0 < self.p_min < 1.0:
            raise ConfigError(f"mcf.p_min must be a probability in (0, 1), got {self.p_min}")
        if self.lexical_weight and self.bar == "fixed":
            raise ConfigError("mcf.lexical_weight needs bar adaptive or top_k: a fused score "
                              "is relative to the round, a fixed threshold on it means nothing")
        if not 0.0 < self.sentence_p_min < 1.0:
            raise ConfigError(f"mcf.sentence_p_min must be a probability in (0, 1), got "
                              f"{self.sentence_p_min}")


def window_rule(backend: LLMBackend, config: MCFConfig, combination: Combination
                ) -> WindowRule:
    """How MCF on `backend` reads documents under `config` with the card's `combination`:
    windows of `config.window_tokens` (else the card's), at most `max_windows_per_doc` read,
    tokens counted by the filter's tokenizer."""
    return WindowRule(config.window_tokens or combination.window_tokens,
                      config.max_windows_per_doc, token_offsets_of(backend))


def home_rule_of(config: MCFConfig, combination: Combination) -> HomeRule | None:
    """The home rule MCF tests its rounds with under `config`: the card's, where the chunk
    score is the card's combination (`score_rule` combined; priors_only's fit has none)."""
    if config.score_rule != "combined" or config.combination == "priors_only":
        return None
    return combination.home


def home_texts(documents: Sequence[Document]) -> list[str]:
    """What the home test reads of a round's passages: each non-blank one as the filter's
    context shows it."""
    return [d.as_context() for d in documents if d.text.strip()]


def dataset_home(config: MCFConfig, combination: Combination | None,
                 rounds: Sequence[tuple[str, Sequence[Document]]], name: str,
                 vectors: RoundVectors = round_vectors) -> tuple[HomeMode, str | None]:
    """The `home` mode every round of a dataset (`rounds`: question and passages each, named
    `name`) runs with: `config.home` as set; where it is auto and MCF tests rounds with a home
    rule (`home_rule_of`), the decision for the whole dataset (`home.dataset_decision`: home
    where its rounds' mean P(home) reaches the card's dataset bar, else each round on its
    own). Also the line that says why (None where nothing was decided)."""
    rule = home_rule_of(config, combination) if combination is not None else None
    if rule is None or config.home != "auto":
        return config.home, None
    return dataset_decision(rule, [(q, home_texts(docs)) for q, docs in rounds], name, vectors)


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


def key_sentence_indices(scores: Sequence[float | None], p_min: float, min_keep: int
                         ) -> list[int]:
    """A one-pass filter's key sentences, in order: those whose P(relevant) (the logistic of
    their s) is at least `p_min`, and at least the `min_keep` best (ties to the earlier);
    a sentence without a score (cut by the context) is never key."""
    read = [i for i, s in enumerate(scores) if s is not None]
    keys = {i for i in read if p_relevant(scores[i]) >= p_min}
    keys.update(sorted(read, key=lambda i: -scores[i])[:min_keep])
    return sorted(keys)


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


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


MCF_SECTION = Section("mcf", MCFConfig, "the trained filter's (MCF's) rules")


class MultiGranularFilter:
    """The `mcf` filter: chunk stage, then sentence stage, on the trained filter's backend."""

    name = "mcf"

    def __init__(self, backend: LLMBackend, config: MCFConfig | None = None,
                 combination: Combination | None = None,
                 priors: PriorScorer = passage_priors,
                 vectors: RoundVectors = round_vectors) -> None:
        """`combination`: the filter's, from its card (`combination.adapter_combination`);
        None: `PRIORS_ONLY`. `priors`: how BM25 and dense scores of a round are computed;
        `vectors`: how its texts are embedded for the home test."""
        self.backend = backend
        self.config = config if config is not None else MCFConfig()
        self.combination = combination if combination is not None else PRIORS_ONLY
        if self.config.combination == "priors_only":
            try:
                self.combination = self.combination.priors_only_fit()
            except AdapterError as err:
                raise ConfigError(f"mcf.combination=priors_only: {err}") from None
        self.priors = priors
        self.vectors = vectors
        self.windows = window_rule(backend, self.config, self.combination)

    @property
    def one_pass(self) -> bool:
        """Whether the filter reads both granularities in one pass (its card says so)."""
        return self.combination.filter_format == "one_pass"

    @property
    def asks_sentences(self) -> bool:
        """Whether the sentence stage asks the filter a prompt of its own: a two-stage filter
        under the sentence stage's filter rule (a one-pass filter read its sentences with the
        chunk; the priors rule asks nothing)."""
        return (self.config.sentence_stage and self.config.sentence_rule == "filter"
                and not self.one_pass)

    def chunk_prompt(self, question: str, document: Document) -> Conversation:
        """The prompt the chunk stage asks on `document`: a one-pass filter's passage prompt
        (its sentences marked), a two-stage filter's chunk prompt. What `chunk_scores` asks
        and what a round's plan counts (`round_plan`)."""
        if self.one_pass:
            return passage_prompt(question, document_sentences(document) or [document.text],
                                  document.title)
        return chunk_prompt(question, document.text, document.title)

    def sentence_prompt(self, question: str, sentences: Sequence[str],
                        title: str = "") -> Conversation:
        """The prompt a two-stage filter's sentence stage asks on a kept chunk's numbered
        `sentences` (asked only of a chunk of two or more)."""
        return sentence_prompt(question, list(sentences), title)

    def chunk_scores(self, question: str, documents: Sequence[Document]) -> list[dict]:
        """s = log P("Yes") − log P("No") per document, with P("Yes") normalised over the two
        labels: a one-pass filter's from one batched marked_label_logprobs call (agent
        `filter_passage`) that also gives each sentence's s (`sentence_scores`), a two-stage
        filter's from one batched label_logprobs call (agent `filter_chunk`)."""
        if self.one_pass:
            return self.passage_scores(question, documents)
        prompts = [self.chunk_prompt(question, d) for d in documents]
        logprobs = self.backend.label_logprobs(prompts, CHUNK_LABELS, agent="filter_chunk")
        scores = [relevance_log_odds(lp) for lp in logprobs]
        return [{"score": score, "p_yes": p_relevant(score)} for score in scores]

    def passage_scores(self, question: str, documents: Sequence[Document]) -> list[dict]:
        """The one-pass reading: per document its s, P("Yes") and each of its sentences' s
        (`document_sentences` order; None where a context cut left one unread)."""
        sentences = [document_sentences(d) or [d.text] for d in documents]
        prompts = [self.chunk_prompt(question, d) for d in documents]
        reads = self.backend.marked_label_logprobs(prompts, CHUNK_LABELS, agent="filter_passage")
        scores = []
        for read, sents in zip(reads, sentences, strict=True):
            passage, per_sentence = passage_verdicts(read, len(sents))
            scores.append({"score": passage, "p_yes": p_relevant(passage),
                           "sentence_scores": per_sentence})
        return scores

    def home_decision(self, question: str, documents: Sequence[Document]
                      ) -> HomeDecision | None:
        """Whether the round is the filter's home text (`filters.home`), tested on retrieval's
        features before any filter call; None where no home rule applies (the card has none,
        or the chunk score is not the card's combination)."""
        rule = home_rule_of(self.config, self.combination)
        if rule is None:
            return None
        texts = home_texts(documents)
        return rule.decide(question, texts, self.config.home, self.vectors) if texts else None

    def chunk_stage(self, question: str, documents: Sequence[Document]) -> FilterResult:
        """Score every document and keep those at or above the bar, best first (full text); a
        document longer than a window by its best read window (`windows`), a blank one 0. A
        round the home test finds home ranks by the home combination (`home_stage`)."""
        if not documents:
            return FilterResult(kept=(), scored=(), threshold=None)
        decision = self.home_decision(question, documents)
        round_ = WindowedRound.of(question, documents, self.windows, self.priors,
                                  self.combination.embedding_model)
        if decision is not None and decision.home:
            return self.home_stage(question, round_, decision)
        # A combination of BM25 and dense alone (the shipped card's) needs no filter call:
        # every chunk's s is then unknown (None in the records), and a long document's best
        # window is the one BM25 + dense rank first. The sentence stage asks on its own.
        reads_filter = self.combination.reads_filter(self.config.score_rule,
                                                     self.config.always_score_chunks)
        scores = (self.chunk_scores(question, round_.read) if reads_filter
                  else round_.prior_scores(question, self.priors,
                                           self.combination.embedding_model))
        best = round_.best(scores)
        if not best:  # every document blank
            return round_.result(best, FilterResult(kept=(), scored=(), threshold=None))
        result = self.chunk_verdicts(question, [b.document for b in best],
                                     [b.scores for b in best])
        if decision is not None:
            result = replace(result, rule_reason=f"{decision.reason}; {result.rule_reason}")
        return round_.result(best, result)

    def home_stage(self, question: str, round_: WindowedRound,
                   decision: HomeDecision) -> FilterResult:
        """A home round: each document's best window by BM25 + dense, the filter reading only
        the home rule's `read` best of them (`home.home_reading`), ranked and cut by the home
        combination; the passages it did not read are not kept (their P(relevant) is the away
        combination's)."""
        rule = self.combination.home
        assert rule is not None  # home_decision found it
        model = self.combination.embedding_model
        best = round_.best(round_.prior_scores(question, self.priors, model))
        if not best:
            return round_.result(best, FilterResult(kept=(), scored=(), threshold=None))
        documents = [b.document for b in best]
        bm25, dense = self.priors(question, [d.as_context() for d in documents], model)
        chosen = home_reading(bm25, dense, rule.read)
        read = self.chunk_verdicts(question, [documents[i] for i in chosen],
                                   self.chunk_scores(question, [documents[i] for i in chosen]),
                                   rule.combination)
        by_position = dict(zip(chosen, read.scored, strict=True))
        away_scores = RoundScores((0.0,) * len(documents), tuple(bm25), tuple(dense))
        away = self.combination.logits(away_scores)
        away_calibrated = self.combination.calibrated_on(away_scores)
        scored = tuple(by_position.get(i) or ScoredDocument(
            d, away[i], False, {"p_yes": None, "filter_score": None, "bm25": round(bm25[i], 4),
                                "dense": round(dense[i], 4),
                                "p_relevant": round(p_relevant(away[i]), 6),
                                "calibrated": away_calibrated})
            for i, d in enumerate(documents))
        unread = len(documents) - len(chosen)
        reason = (f"{decision.reason}; the filter read the priors' best {len(chosen)} of "
                  f"{len(documents)}" + (f" ({unread} not kept unread)" if unread else "")
                  + f"; {read.rule_reason}")
        result = replace(read, scored=scored, rule=f"home_{read.rule}", rule_reason=reason)
        return round_.result(best, result)

    def chunk_verdicts(self, question: str, documents: Sequence[Document],
                       scores: Sequence[dict], combination: Combination | None = None
                       ) -> FilterResult:
        """The chunk stage's verdicts on `documents` (at least one) from their `chunk_scores`:
        each chunk's score under the config's rule, its P(relevant) from `combination` (default
        the card's away combination), the bar applied, kept ones best first."""
        combination = combination if combination is not None else self.combination
        # s of a chunk the filter did not read (`Combination.reads_filter`) is unknown: 0 in the
        # combination's inputs, which then give it no weight.
        log_odds = [s["score"] if s["p_yes"] is not None else 0.0 for s in scores]
        bm25, dense = self.priors(question, [d.as_context() for d in documents],
                                  self.combination.embedding_model)
        combined = combination.logits(RoundScores(tuple(log_odds), tuple(bm25), tuple(dense)))
        details = [{"p_yes": _rounded(s["p_yes"], 4),
                    "filter_score": _rounded(s["score"] if s["p_yes"] is not None else None, 4),
                    "bm25": round(b, 4), "dense": round(d, 4),
                    "p_relevant": round(p_relevant(c), 6),
                    **({"sentence_scores": [None if v is None else round(v, 4)
                                            for v in s["sentence_scores"]]}
                       if "sentence_scores" in s else {})}
                   for s, b, d, c in zip(scores, bm25, dense, combined, strict=True)]
        rule = self.config.score_rule
        values = (combined if rule == "combined" else log_odds if rule == "filter"
                  else with_prior(log_odds, bm25, self.config.prior_weight))
        round_scores = RoundScores(tuple(log_odds), tuple(bm25), tuple(dense))
        unlike = combination.unlike(round_scores)  # the shift guard's findings, read once
        decided = self.bar(values, round_scores, combination, unlike)
        calibrated = combination.calibrated_given(unlike)
        for detail in details:
            detail["calibrated"] = calibrated
        if unlike and combination.fitted and not self.config.shift_guard:
            # the guard is off the bar (mcf.shift_guard false), not off what the score is called
            decided = replace(decided, reason=f"{decided.reason}; P(relevant) not calibrated "
                              f"here: unlike the fitting rounds in {'; '.join(unlike)}")
        scored = tuple(ScoredDocument(d, value, value >= decided.bar, detail)
                       for d, value, detail in zip(documents, values, details, strict=True))
        kept = tuple(sorted((s for s in scored if s.kept), key=lambda s: -s.score))
        return FilterResult(kept=kept, scored=scored, threshold=decided.bar,
                            rule=decided.rule, rule_reason=decided.reason,
                            calibrated=calibrated)

    def bar(self, scores: Sequence[float], round_scores: RoundScores,
            combination: Combination | None = None, unlike: Sequence[str] | None = None
            ) -> RoundBar:
        """The round's bar on the scores, and the rule that set it. top_k: the k-th best
        score (ties at it are kept too); calibrated: the combination's `round_bar` (P(relevant)
        >= p_min, at least min_keep, and at least the card's top_k where its shift guard finds
        the round unlike the fitting rounds: `unlike`, its findings where the caller has them)
        when the score is a fitted combination, else top_k's."""
        config = self.config
        combination = combination if combination is not None else self.combination
        if config.bar == "fixed":
            return RoundBar(config.threshold, "fixed", f"s >= {config.threshold:g}")
        if config.bar == "adaptive":
            return RoundBar(judge_bar(scores, config.bar_n), "adaptive",
                            f"score >= mean - {config.bar_n:g}·std over the round")
        if (config.bar == "calibrated" and combination.fitted
                and config.score_rule == "combined"):
            return combination.round_bar(round_scores, config.p_min, config.min_keep,
                                         unlike=unlike if config.shift_guard else [])
        k = config.top_k
        why = ("the top_k bar" if config.bar == "top_k" else
               "the card holds no fitted combination, so no calibrated bar")
        return RoundBar(sorted(scores, reverse=True)[min(k, len(scores)) - 1], "top_k",
                        f"the {k} best kept: {why}")

    def sentence_stage(self, question: str,
                       kept: Sequence[ScoredDocument]) -> list[ScoredDocument]:
        """Each kept chunk narrowed to its key sentences (same order): a one-pass filter's
        from the sentence scores its chunk stage read, a two-stage filter's from one batched
        generation (agent `filter_sentence`); a chunk with no key sentence under
        `drop_chunk` comes back with kept=False."""
        sentences = [document_sentences(s.document) for s in kept]
        if self.config.sentence_rule == "priors":
            return self._narrow_by_priors(question, kept, sentences)
        if self.one_pass:
            return self._narrow_by_scores(question, kept, sentences)
        asked = [i for i, sents in enumerate(sentences) if len(sents) > 1]
        replies: dict[int, str] = {}
        if asked:
            prompts = [self.sentence_prompt(question, sentences[i], kept[i].document.title)
                       for i in asked]
            settings = GenerationSettings(max_new_tokens=self.config.sentence_max_new_tokens,
                                          stop=("\n",))
            answers = self.backend.generate(prompts, settings, agent="filter_sentence")
            replies = dict(zip(asked, answers, strict=True))
        return [self._narrow(scored, sentences[i], replies.get(i))
                for i, scored in enumerate(kept)]

    def _narrow_by_priors(self, question: str, kept: Sequence[ScoredDocument],
                          sentences: Sequence[list[str]]) -> list[ScoredDocument]:
        """The priors rule's sentence stage (`sentence_priors`): no filter call."""
        fused = fused_sentence_scores(question, sentences, self.priors,
                                      self.combination.embedding_model)
        return [self._with_prior_keys(scored, sents, scores)
                for scored, sents, scores in zip(kept, sentences, fused, strict=True)]

    def _with_prior_keys(self, scored: ScoredDocument, sentences: list[str],
                         scores: list[float]) -> ScoredDocument:
        """A kept chunk cut to the sentences the priors rule keeps (`prior_key_sentences`)."""
        details = {**scored.details, "sentence_rule": "priors",
                   "sentence_prior_scores": [round(s, 4) for s in scores]}
        if len(sentences) <= 1:
            return replace(scored, details={**details, "sentence_status": "single",
                                            "key_sentences": list(range(len(sentences)))})
        keys = prior_key_sentences(scores, self.config.sentence_bar,
                                   self.config.sentence_min_keep)
        return self._with_keys(scored, sentences, keys, details)

    def _narrow_by_scores(self, question: str, kept: Sequence[ScoredDocument],
                          sentences: Sequence[list[str]]) -> list[ScoredDocument]:
        """A one-pass filter's sentence stage: the sentence scores its chunk stage read (one
        batched call scores the chunks given without them)."""
        unread = [i for i, s in enumerate(kept) if "sentence_scores" not in s.details]
        if unread:
            read = self.passage_scores(question, [kept[i].document for i in unread])
            kept = list(kept)
            for i, scores in zip(unread, read, strict=True):
                kept[i] = replace(kept[i], details={**kept[i].details,
                                                    "sentence_scores": scores["sentence_scores"]})
        return [self._narrow_scored(scored, sents)
                for scored, sents in zip(kept, sentences, strict=True)]

    def _narrow_scored(self, scored: ScoredDocument, sentences: list[str]) -> ScoredDocument:
        """A one-pass filter's kept chunk cut to its key sentences (`key_sentence_indices`)."""
        if len(sentences) <= 1:
            return replace(scored, details={**scored.details, "sentence_status": "single",
                                            "key_sentences": list(range(len(sentences)))})
        keys = key_sentence_indices(scored.details["sentence_scores"],
                                    self.config.sentence_p_min, self.config.sentence_min_keep)
        return self._with_keys(scored, sentences, keys, dict(scored.details))

    def _with_keys(self, scored: ScoredDocument, sentences: list[str], keys: list[int],
                   details: dict) -> ScoredDocument:
        """The chunk narrowed to `keys` (none: whole, or dropped under drop_chunk)."""
        every = list(range(len(sentences)))
        if not keys:
            if self.config.empty_sentence_answer == "drop_chunk":
                return replace(scored, kept=False,
                               details={**details, "sentence_status": "none_dropped",
                                        "key_sentences": []})
            return replace(scored, details={**details, "sentence_status": "none",
                                            "key_sentences": every})
        return replace(scored, document=narrowed(scored.document, sentences, keys),
                       details={**details, "sentence_status": "parsed", "key_sentences": keys})

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
        return self._with_keys(scored, sentences, keys, details)

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
        return replace(chunks, kept=kept, scored=scored)
