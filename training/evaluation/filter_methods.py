"""The chunk filters `eval-filter` compares, each run over the same questions' passages.

Each method turns every evaluated question's passages into `ChunkDecisions`: a score per
passage (None for methods without one) and the ids of the passages kept.

* MCF rows — the filter amber runs, `inference.filters.mcf.MultiGranularFilter`, called
  exactly as amber calls it (`select`, with the filter's card's combination), once per
  `MCFConfig`; the row's name says which config (`mcf_row_name`): its bar (the calibrated
  bar on P(relevant), fixed threshold on s = log P(Yes) − log P(No), adaptive mean − n·σ, or
  top_k), its score (s alone, the combination of s with BM25 and dense, or the fixed fusion
  z(s) + w·z(BM25)), "default" for amber's default chunk rule, and for sentence-level rows
  its sentence stage.
* `MAIN-RAG judge` — `inference.filters.judge.MainRagJudge` on the same base model without
  the adapter: r = log P(Yes) − log P(No) after Agent-1's per-passage answer, kept when
  r ≥ τq = mean(r) − n·σ(r).
* `BM25 top-k`, `dense top-k` — the k passages that score best for the question, with the
  retrieval package's BM25 (bm25s) and its dense encoder (all-MiniLM-L6-v2 cosine).
* `keep all` — every passage.

MCF runs on a `CachingBackend` (`training.evaluation.caching_backend`), so each passage is scored,
and each sentence-stage reply generated, once for all the rows. The model-calling methods
run `concurrency` questions at once (`training.evaluation.questions_in_flight.by_question`); their
results are by question id in dataset order, whatever the concurrency.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from sieverag.inference.core.types import Example
from sieverag.inference.data import example_source
from sieverag.inference.filters.card.combination import Combination
from sieverag.inference.filters.document_filter import FilterResult, ScoredDocument
from sieverag.inference.filters.mcf import (
    MCFConfig,
    MultiGranularFilter,
    dataset_home,
    source_positions,
)
from sieverag.inference.llm.backend_protocol import LLMBackend
from sieverag.inference.metrics.filter_scores import top_k_indices
from sieverag.training.evaluation.questions_in_flight import by_question

SentenceIds = set[tuple[str, int]]
"""(passage id, index in the passage's own sentence split) pairs."""


@dataclass(frozen=True)
class ChunkDecisions:
    """One method's verdict on the passages of every evaluated question."""

    method: str
    kept: dict[str, tuple[str, ...]]
    """Example id → kept passage ids, best first where the method ranks."""
    scores: dict[str, float] | None
    """Passage id → the method's score (higher = more relevant); None: no score."""
    probabilities: dict[str, float] | None = None
    """Passage id → the method's P(relevant); None: it gives none."""


# ----- MCF, the filter amber runs ----------------------------------------------------------


_DEFAULT = MCFConfig()


def mcf_row_name(config: MCFConfig) -> str:
    """The report row of MCF's chunk stage under `config`, e.g. "MCF top_k=2 + BM25 prior w=1",
    "MCF top_k=2 + combination"; the chunk rule amber runs by default is labelled "default"
    ("MCF default: calibrated P>=card bar, min card + combination")."""
    bar = {"fixed": f"fixed log-odds>={config.threshold:g}",
           "adaptive": f"adaptive n={config.bar_n:g}",
           "top_k": f"top_k={config.top_k}",
           "calibrated": (f"calibrated P>={config.p_min:g}" if config.p_min is not None
                          else "calibrated P>=card bar")
                         + (", min card" if config.min_keep is None else f", min {config.min_keep}")
                         + ("" if config.shift_guard else ", no shift guard"),
           }[config.bar]
    score = {"filter": "", "fused": f" + BM25 prior w={config.prior_weight:g}",
             "combined": (" + combination" if config.combination == "card"
                          else " + priors-only fit")}[config.score_rule]
    default = "default: " if _chunk_rule(config) == _chunk_rule(_DEFAULT) else ""
    home = {"auto": "", "home": ", home rule on every round",
            "away": ", away rule only"}[config.home]
    return f"MCF {default}{bar}{score}{home}"


def _chunk_rule(config: MCFConfig) -> tuple:
    """What decides MCF's chunk verdicts (not its sentence stage)."""
    return (config.bar, config.threshold, config.bar_n, config.top_k, config.p_min,
            config.min_keep, config.shift_guard, config.lexical_weight, config.combination,
            config.home)


def probability_key(config: MCFConfig) -> str | None:
    """The detail holding the P(relevant) of an MCF row's score: the combination's, or for
    the filter alone its P(Yes); None for the fixed fusion (its score is no probability)."""
    return {"combined": "p_relevant", "filter": "p_yes", "fused": None}[config.score_rule]


def sentence_stage_name(config: MCFConfig) -> str:
    """MCF's sentence stage under `config`, e.g. "MCF sentence stage (16 tokens, empty→keep
    chunk)": the reply's length cap and what a "none" reply does."""
    return f"MCF {_sentence_stage(config)}"


def sentence_row_name(config: MCFConfig) -> str:
    """The report row of MCF under `config` with its sentence stage on, e.g. "MCF top_k=2 →
    sentence stage (16 tokens, empty→keep chunk)"."""
    return f"{mcf_row_name(config)} → {_sentence_stage(config)}"


def _sentence_stage(config: MCFConfig) -> str:
    empty = "keep" if config.empty_sentence_answer == "keep_chunk" else "drop"
    return f"sentence stage ({config.sentence_max_new_tokens} tokens, empty→{empty} chunk)"


def mcf_results(backend: LLMBackend, examples: Sequence[Example], config: MCFConfig, *,
                combination: Combination | None = None, progress: bool = True,
                concurrency: int = 1) -> dict[str, FilterResult]:
    """Example id → `MultiGranularFilter(backend, config, combination).select` on its
    passages, `concurrency` questions at once. Where the card has a home rule and
    `config.home` is auto, each dataset (source) is decided as a whole first
    (`home.dataset_decision`): a dataset of the filter's home text ranks every round at home."""
    filters = {source: MultiGranularFilter(backend, replace(config, home=mode), combination)
               for source, mode in dataset_modes(examples, config, combination).items()}
    return by_question(
        examples, lambda e: filters[example_source(e)].select(e.question, e.documents),
        concurrency=concurrency, desc=mcf_row_name(config), progress=progress)


def dataset_modes(examples: Sequence[Example], config: MCFConfig,
                  combination: Combination | None) -> dict[str, str]:
    """Source → the `mcf.home` its questions run with (`mcf.dataset_home`: `config.home`, or
    where that is auto and the card has a home rule, the dataset decision, said in one line
    per source)."""
    modes = {}
    for source in sorted({example_source(e) for e in examples}):
        mine = [e for e in examples if example_source(e) == source]
        # The same questions, home setting and card: decided (and said) once. The entry
        # holds its combination, so the id in its key is that combination's while it lasts.
        key = (source, tuple(e.id for e in mine), config.home, config.score_rule,
               config.combination, id(combination))
        if key not in _DECIDED:  # one line per dataset, however many rows run it
            decided = dataset_home(config, combination,
                                   [(e.question, e.documents) for e in mine], source)
            _DECIDED[key] = (combination, decided[0])
            if decided[1] is not None:
                print(decided[1], flush=True)
        modes[source] = _DECIDED[key][1]
    return modes


_DECIDED: dict[tuple, tuple[Combination | None, str]] = {}


def decisions_of(method: str, results: Mapping[str, FilterResult],
                 probability: str | None = None) -> ChunkDecisions:
    """A filter's results as `ChunkDecisions`: kept ids best first, every passage's score, and
    its P(relevant) where the detail `probability` holds one and MCF calls it a calibrated
    probability on its round."""
    kept = {example_id: tuple(s.document.id for s in result.kept)
            for example_id, result in results.items()}
    scores = {s.document.id: s.score for result in results.values() for s in result.scored}
    # A blank passage is not read: MCF gives it P(relevant) 0 and no other detail. A passage
    # of a round where MCF does not call it a probability (`calibrated` false) has none.
    probabilities = None if probability is None else {
        s.document.id: s.details.get(probability, 0.0) for result in results.values()
        for s in result.scored if s.details.get("calibrated") is not False}
    return ChunkDecisions(method, kept, scores, probabilities)


def mcf_sentence_results(backend: LLMBackend, examples: Sequence[Example],
                         configs: Sequence[MCFConfig], *,
                         combination: Combination | None = None, progress: bool = True,
                         concurrency: int = 1
                         ) -> tuple[list[dict[str, FilterResult]], dict[str, FilterResult]]:
    """MCF with its sentence stage on, per config (`select`, as amber runs it), and MCF's
    sentence stage alone on each question's gold passages (the oracle row, under the first
    config's sentence settings); `concurrency` questions at once.

    `backend` should be a `CachingBackend` (or one batching calls into it): per question, one
    sentence-stage batch over every passage some config keeps (or that is gold) fills it, and
    the configs' own runs read it.
    """
    filters = [MultiGranularFilter(backend, replace(c, sentence_stage=True), combination)
               for c in configs]

    def one_question(example: Example) -> tuple[list[FilterResult], FilterResult]:
        gold = [ScoredDocument(d, 0.0, True) for d in example.documents if d.is_gold]
        wanted = {s.document.id for f in filters
                  for s in f.chunk_stage(example.question, example.documents).kept}
        wanted |= {s.document.id for s in gold}
        filters[0].sentence_stage(example.question, [
            ScoredDocument(d, 0.0, True) for d in example.documents if d.id in wanted])
        staged = [mcf.select(example.question, example.documents) for mcf in filters]
        return staged, filters[0].narrow(
            example.question, FilterResult(kept=tuple(gold), scored=tuple(gold), threshold=None))

    results = by_question(examples, one_question, concurrency=concurrency,
                          desc="MCF sentence stage", progress=progress)
    per_config = [{example_id: staged[i] for example_id, (staged, _) in results.items()}
                  for i in range(len(configs))]
    return per_config, {example_id: oracle for example_id, (_, oracle) in results.items()}


def kept_sentences(result: FilterResult, example: Example) -> SentenceIds:
    """The (passage id, sentence index) pairs an MCF result with its sentence stage keeps:
    each kept passage's `key_sentences`, mapped back to the data's sentence split."""
    documents = {d.id: d for d in example.documents}
    pairs: SentenceIds = set()
    for scored in result.kept:
        positions = source_positions(documents[scored.document.id])
        pairs |= {(scored.document.id, positions[k]) for k in scored.details["key_sentences"]}
    return pairs


def whole_passages(example: Example, kept_ids: Iterable[str]) -> SentenceIds:
    """Every sentence of the kept passages (the sentences MCF would number)."""
    wanted = set(kept_ids)
    return {(d.id, i) for d in example.documents if d.id in wanted for i in source_positions(d)}


def sentence_statuses(results: Iterable[Mapping[str, FilterResult]]) -> dict[str, str]:
    """Passage id → MCF's `sentence_status` where the sentence stage asked the filter
    (parsed, unparsed, none, none_dropped), over every given result."""
    statuses = {}
    for by_example in results:
        for result in by_example.values():
            for scored in result.scored:
                if "sentence_reply" in scored.details:
                    statuses[scored.document.id] = scored.details["sentence_status"]
    return statuses


# ----- baselines ---------------------------------------------------------------------------


def top_k_decisions(method: str, examples: Sequence[Example], scores: dict[str, float],
                    k: int) -> ChunkDecisions:
    """Keep each question's k best-scoring passages (ties: the earlier passage)."""
    kept = {}
    for example in examples:
        best = top_k_indices([scores[d.id] for d in example.documents], k)
        kept[example.id] = tuple(example.documents[i].id for i in best)
    return ChunkDecisions(method, kept, scores)


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
                    progress: bool = True, concurrency: int = 1) -> ChunkDecisions:
    """The MAIN-RAG judge's keep decisions and scores r, question by question
    (`concurrency` at once)."""
    from sieverag.inference.filters.judge import JudgeConfig, MainRagJudge

    judge = MainRagJudge(backend, JudgeConfig(bar_n=bar_n))
    results = by_question(examples, lambda e: judge.select(e.question, e.documents),
                          concurrency=concurrency, desc="MAIN-RAG judge", progress=progress,
                          resumable=False)
    return decisions_of("MAIN-RAG judge", results)
