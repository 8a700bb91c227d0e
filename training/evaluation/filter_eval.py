"""`eval-filter`: the trained filter, as amber runs it, against its baselines on held-out
questions of one or more datasets with gold-marked passages (HotpotQA, NQ, SQuAD, common
format, `sieverag hard-negatives` sets), with a cross-dataset summary (`dataset_summary`).

The filter rows are the real MCF (`MultiGranularFilter`, inference/filters/mcf.py) under the
`MCFConfig`s `mcf_configs` lists, each row named for its config (`filter_methods.mcf_row_name`);
the judge row is the real `MainRagJudge`. Every method (see `training.evaluation.filter_methods`)
runs on the SAME held-out questions (`training.evaluation.held_out_questions`: the dataset's rows
minus the questions any training split was built from, matched by (source, question id) — so a
source left out of training is evaluated whole; questions without a gold passage left out, counted).
The command's settings are `training.evaluation.filter_eval_config.FilterEvalConfig`.

Metrics (defined in `inference.metrics.filter_scores`, with every other metric):

* chunk level, against the gold passages (`is_gold`): per-question precision / recall / F1
  of the kept passage ids, averaged over questions (macro); the same pooled over all
  passages (micro); passages kept per question; AUROC and average precision of the method's
  score over all passages (methods with a score).
* sentence level, on the questions with supporting facts, against the set of
  (passage, sentence) supporting facts: every MCF row as amber reads it by default (whole
  passages) and with MCF's sentence stage on (`select` with `sentence_stage`), every baseline
  keeping whole passages (all their sentences), and two oracle reference rows on the gold
  passages (all sentences; MCF's sentence stage alone).

Model work is cached in `OUT/cache/` (`training.evaluation.method_cache`) under a fingerprint of
what decides it (model, adapter content, and for the judge the questions and bar): the filter's
answers per request (`filter-chunks.json`, `filter-sentences.json`, written after each
stage) and the judge's decisions (`judge.json`), so a rerun after an interruption skips
finished work.

`concurrency` questions run at once in every per-question model loop (`--concurrency`, as
`sieverag eval` runs them: `training.evaluation.questions_in_flight`); in-process models (the
filter, the judge) share one `CallBatcher`, which merges the questions' concurrent calls, and wraps
the filter's `CachingBackend` itself, so merged calls fill and read its tables. Whatever
order the questions finish in, the report and decisions are in dataset order and the cache
tables are written sorted by request, the cache also after a failed question.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from sieverag.inference.agents.roles import ModelRoles, resolve_filter_role
from sieverag.inference.core.in_flight import default_concurrency
from sieverag.inference.core.io_utils import check_output_folder
from sieverag.inference.core.settings import settings_to_data
from sieverag.inference.core.types import Example
from sieverag.inference.data import PassageHandling, example_source, odd_passages_line
from sieverag.inference.filters.card.combination import Combination
from sieverag.inference.filters.mcf import MCFConfig, window_rule
from sieverag.inference.filters.role_card import filter_card
from sieverag.inference.llm.backend_protocol import LLMBackend
from sieverag.inference.llm.backend_registry import BackendSpec, build_backend
from sieverag.inference.llm.call_batching import (
    CallBatcher,
    on_batcher,
    question_batcher,
    warn_capped_requests,
)
from sieverag.inference.metrics.filter_scores import (
    chunk_quality,
    has_supporting_facts,
    paired_f1_difference,
    sentence_quality,
)
from sieverag.training.evaluation import filter_methods as methods
from sieverag.training.evaluation.caching_backend import CachingBackend
from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig
from sieverag.training.evaluation.held_out_questions import (
    Selection,
    select_examples,
    training_questions,
)
from sieverag.training.evaluation.method_cache import MethodCache

JUDGE = "MAIN-RAG judge"
KEEP_ALL = "keep all"
ORACLE_ALL = "oracle: gold passages, all sentences"
WHOLE = " (whole passages)"


def run_filter_eval(config: FilterEvalConfig, *, progress: bool = True,
                    command: str | None = None, concurrency: int | None = None
                    ) -> dict[str, Any]:
    """Evaluate the filter and the baselines on each dataset; write report.json, report.md,
    the plot and report.html. The report's top-level figures are the first dataset's;
    `datasets` holds every dataset's section and `by_dataset` the cross-dataset summary.

    `concurrency`: questions in flight in each model loop (unset: 16 when the filter, and the
    judge where it runs, are served, else 1); the report is the same at any value."""
    from sieverag.training.evaluation.filter_eval_html import write_filter_eval_html
    from sieverag.training.evaluation.filter_report import DatasetDecisions, write_report

    check_output_folder(config.out)
    filter_role = resolve_filter_role(config.models.filter)  # the adapter found and checked
    judge_role = _judge_role(config.models, filter_role)
    all_served = filter_role.endpoint is not None and (not config.judge
                                                       or judge_role.endpoint is not None)
    concurrency = default_concurrency(concurrency, all_served)
    warn_capped_requests([filter_role, *([judge_role] if config.judge else [])], concurrency)
    card = filter_card(filter_role, config.models.filter_card)
    metadata = dict(card.card or {})
    combination = card.combination
    trained = training_questions(config, metadata, card.source)
    out = Path(config.out)
    cache = MethodCache(out / "cache")
    filter_identity = _filter_identity(filter_role)
    tables = {name: cache.load(f"filter-{name}", filter_identity) or {}
              for name in ("chunks", "sentences", "passages")}
    # Every dataset is read before the filter loads: a bad file fails at once.
    selections = [select_examples(config, trained, dataset) for dataset in config.dataset]
    mcf_backend = CachingBackend(build_backend(filter_role), tables["chunks"],
                                 tables["sentences"], tables["passages"])
    live = {"chunks": mcf_backend.labels, "sentences": mcf_backend.replies,
            "passages": mcf_backend.marked}
    rule = window_rule(mcf_backend, MCFConfig(), combination)
    odd_passages = odd_passages_line(
        [e for selection in selections for e in selection.examples],
        PassageHandling(blank="not read by the filter (P(relevant) 0)", duplicate="scored again",
                        long="read by the filter in windows, judged by its best",
                        window=f"the filter's window of {rule.window_tokens} tokens",
                        fits=rule.fits))
    stored = {name: len(table) for name, table in tables.items()}

    def store_tables() -> None:
        for kind, table in live.items():
            if len(table) > stored[kind]:
                # A copy (one atomic step), sorted: the file is the same whatever order the
                # questions finished in, and no thread still in flight changes it meanwhile.
                cache.store(f"filter-{kind}", filter_identity, dict(sorted(dict(table).items())))
                stored[kind] = len(table)

    sections, outputs = {}, []
    with question_batcher(concurrency, all_served) as batcher:
        # The outermost backend is batched: merged calls still fill and read its tables.
        filter_backend = on_batcher(mcf_backend, filter_role.endpoint is not None, batcher)
        for selection in selections:
            try:
                section, decisions, sentence_kept = _evaluate(
                    config, selection, filter_backend, judge_role, cache, filter_role.device,
                    progress, combination, concurrency, batcher)
            finally:  # what finished is kept, even when a question failed
                store_tables()
            name = _section_name(selection.dataset, sections)
            sections[name] = section
            outputs.append(DatasetDecisions(name, decisions, selection.examples,
                                            sentence_kept))

    configs = mcf_configs(config, combination)
    mcf_rows = {methods.mcf_row_name(c): asdict(c) for c in configs}
    amber_default = methods.mcf_row_name(MCFConfig())
    report = {
        "command": command,
        "config": settings_to_data(config),
        "filter": {"adapter": filter_role.adapter, "name": metadata.get("name"),
                   "served_as": filter_role.model if filter_role.endpoint else None,
                   "base_model": None if filter_role.endpoint else filter_role.model,
                   "mcf_rows": mcf_rows,
                   "amber_default_row": amber_default if amber_default in mcf_rows else None,
                   # None: the card holds no fitted combination (`ranking` says what ranks)
                   "combination": combination.as_card() if combination.fitted else None,
                   "ranking": card.ranking_statement(MCFConfig())},
        **next(iter(sections.values())),
        # What MCF skipped or read in windows, over every dataset (`odd_passages_line`).
        "odd_passages": odd_passages,
        "datasets": sections,
        "by_dataset": {name: dataset_summary(section, config.top_k)
                       for name, section in sections.items()},
    }
    write_report(report, outputs, out)
    write_filter_eval_html(report, outputs, out)
    return report


def _section_name(dataset: str, taken: Mapping[str, Any]) -> str:
    """A dataset's name in the report: its file name (numbered when two files share one)."""
    name = Path(dataset).name
    return name if name not in taken else f"{name} ({len(taken) + 1})"


def _evaluate(config: FilterEvalConfig, selection: Selection, mcf_backend: LLMBackend,
              judge_role: BackendSpec, cache: MethodCache, device: str, progress: bool,
              combination: Combination | None = None, concurrency: int = 1,
              batcher: CallBatcher | None = None
              ) -> tuple[dict[str, Any], list[methods.ChunkDecisions],
                         dict[str, dict[str, set[tuple[str, int]]]]]:
    """Every row on one dataset's selected questions, `concurrency` at once: its report
    section, the chunk decisions and the sentence rows' kept sentences. `mcf_backend`: the
    filter's `CachingBackend` (or the batcher's wrapper of it); the judge's backend, built
    here, joins `batcher` when it runs in-process."""
    examples = selection.examples
    configs = mcf_configs(config, combination)
    decisions = [methods.decisions_of(methods.mcf_row_name(c), methods.mcf_results(
        mcf_backend, examples, c, combination=combination, progress=progress,
        concurrency=concurrency), methods.probability_key(c)) for c in configs]
    if config.judge:
        question_key = sorted(e.id for e in examples)
        served = judge_role.endpoint is not None
        judge_state = cache.get_or_compute(
            "judge", {"judge": settings_to_data(judge_role), "n": config.judge_n,
                      "questions": question_key},
            lambda: _judge_state(on_batcher(build_backend(judge_role), served, batcher),
                                 examples, config.judge_n, progress, concurrency))
        decisions.append(methods.ChunkDecisions(
            JUDGE, {k: tuple(v) for k, v in judge_state["kept"].items()},
            judge_state["scores"]))
    bm25 = methods.bm25_scores(examples)
    decisions += [
        methods.top_k_decisions(f"BM25 top-{config.top_k}", examples, bm25, config.top_k),
        methods.top_k_decisions(
            f"dense top-{config.top_k}", examples,
            methods.dense_scores(examples, config.embedding_model, device), config.top_k),
        methods.keep_all(examples),
    ]
    chunk = {d.method: chunk_quality(examples, d.kept, d.scores, d.probabilities)
             for d in decisions}
    against = _default_against_retrieval(examples, decisions, chunk, config.top_k)

    with_facts = [e for e in examples if has_supporting_facts(e)]
    sentence: dict[str, dict[str, float]] = {}
    sentence_kept: dict[str, dict[str, set[tuple[str, int]]]] = {}
    parse = {"answers": 0, "unparsed": 0, "none": 0}
    if with_facts:
        sentence_kept, parse = _sentence_level(configs, mcf_backend, with_facts, decisions,
                                               progress, combination, concurrency)
        sentence = {name: sentence_quality(with_facts, kept)
                    for name, kept in sentence_kept.items()}
    section = {
        "dataset": selection.dataset,
        "sources": sorted({example_source(e) for e in examples}),
        "questions": {"evaluated": len(examples), "rows_in_dataset": selection.rows,
                      "excluded_as_training": selection.excluded_training,
                      "without_gold": selection.without_gold,
                      "training_datasets": list(selection.training_sources),
                      "outside_id_list": selection.outside_id_list,
                      "with_supporting_facts": len(with_facts)},
        "passages": {"total": sum(len(e.documents) for e in examples),
                     "gold": sum(d.is_gold is True for e in examples for d in e.documents)},
        "chunk": chunk,
        "sentence": sentence,
        "sentence_answers": parse,
        "comparison": _comparison(chunk, [methods.mcf_row_name(c) for c in configs],
                                  config.top_k, config.judge),
        "default_against_retrieval": against,
    }
    return section, decisions, sentence_kept


def _default_against_retrieval(examples: Sequence[Example],
                               decisions: Sequence[methods.ChunkDecisions],
                               chunk: Mapping[str, Mapping[str, Any]], top_k: int
                               ) -> dict[str, Any] | None:
    """Amber's default row against the better (by F1) of BM25's and dense's top-k, question by
    question (`paired_f1_difference`: the F1 difference and its 95 % bootstrap interval);
    None without a default row."""
    by_method = {d.method: d for d in decisions}
    default = by_method.get(methods.mcf_row_name(MCFConfig()))
    if default is None:
        return None
    retrieval = max((f"BM25 top-{top_k}", f"dense top-{top_k}"),
                    key=lambda name: chunk[name]["f1"] or 0.0)

    def questions(kept: Mapping[str, Sequence[str]]) -> list[tuple[set, set]]:
        return [(set(kept[e.id]), {d.id for d in e.documents if d.is_gold}) for e in examples]

    paired = paired_f1_difference(questions(default.kept), questions(by_method[retrieval].kept))
    return None if paired is None else {"against": retrieval, **paired}


def dataset_summary(section: Mapping[str, Any], top_k: int) -> dict[str, Any]:
    """One dataset's line of the cross-dataset table: the filter alone (its score s: AUROC,
    top-k F1, ECE of its P(Yes), what its fixed bar keeps), the priors alone (BM25 and dense:
    AUROC, top-k F1) and amber's default (the combination: AUROC, F1 and passages kept at its
    own bar, ECE of its P(relevant), and its top-k F1)."""
    chunk = section["chunk"]
    fixed = next(name for name in chunk if name.startswith("MCF fixed"))
    top = f"MCF top_k={top_k}"
    default = chunk.get(methods.mcf_row_name(MCFConfig())) or {}
    combined = chunk.get(f"MCF top_k={top_k} + combination") or {}
    bm25, dense = chunk[f"BM25 top-{top_k}"], chunk[f"dense top-{top_k}"]
    against = section.get("default_against_retrieval") or {}
    priors = [v for v in (bm25["auroc"], dense["auroc"]) if v is not None]
    return {
        "questions": section["questions"]["evaluated"],
        "passages": section["passages"]["total"], "gold": section["passages"]["gold"],
        "filter_auroc": chunk[top]["auroc"],
        "bm25_auroc": bm25["auroc"],
        "dense_auroc": dense["auroc"],
        "better_prior_auroc": max(priors) if priors else None,
        "default_auroc": default.get("auroc"),
        "filter_top_k_f1": chunk[top]["f1"],
        "bm25_top_k_f1": bm25["f1"],
        "dense_top_k_f1": dense["f1"],
        "default_top_k_f1": combined.get("f1"),
        "amber_default_f1": default.get("f1"),
        "default_kept_per_question": default.get("kept_per_question"),
        "default_ece": default.get("ece"),
        "default_calibrated_share": default.get("calibrated_share"),
        "filter_ece": chunk[top].get("ece"),
        "fixed_bar_f1": chunk[fixed]["f1"],
        "fixed_bar_kept_per_question": chunk[fixed]["kept_per_question"],
        "default_minus_retrieval_f1": against.get("difference"),
        "default_minus_retrieval_interval": against.get("interval95"),
        "sentence_stage_f1": next((figures["f1"] for name, figures in section["sentence"].items()
                                   if name.startswith(f"{top} → ")), None),
    }


def mcf_configs(config: FilterEvalConfig, combination: Combination | None = None
                ) -> list[MCFConfig]:
    """The MCF configs of the filter rows: amber's default (the combination at its calibrated
    bar), the fixed bar, top_k on the filter alone, top_k on the combination, then (when
    lexical_weight > 0) top_k with the fixed BM25 fusion, adaptive, then adaptive with the
    fusion; the card's priors-only fit at its own bar right after the default where the card
    holds one (what the filter adds), and where it holds a home rule the default with every
    round home and with none (what the home test's choice is worth); every one with the given
    sentence settings and its sentence stage off (the sentence-level rows turn it on)."""
    sentences = {"sentence_max_new_tokens": config.sentence_max_new_tokens,
                 "empty_sentence_answer": config.empty_sentence_answer}
    top_k = {"bar": "top_k", "top_k": config.top_k, **sentences}
    adaptive = {"bar": "adaptive", "bar_n": config.bar_n, **sentences}
    with_prior = config.lexical_weight > 0
    has_priors_fit = combination is not None and combination.holds_priors_only_fit
    has_home = combination is not None and combination.home is not None
    return [MCFConfig(**sentences),
            *([MCFConfig(home="home", **sentences), MCFConfig(home="away", **sentences)]
              if has_home else []),
            *([MCFConfig(combination="priors_only", **sentences)] if has_priors_fit else []),
            MCFConfig(bar="fixed", threshold=config.threshold, lexical_weight=0.0, **sentences),
            MCFConfig(**top_k, lexical_weight=0.0),
            MCFConfig(**top_k),
            *([MCFConfig(**top_k, lexical_weight=config.lexical_weight)] if with_prior else []),
            MCFConfig(**adaptive, lexical_weight=0.0),
            *([MCFConfig(**adaptive, lexical_weight=config.lexical_weight)] if with_prior
              else [])]


def _judge_role(models: ModelRoles, filter_role: BackendSpec) -> BackendSpec:
    """The judge row's model: `models.judge` when set, else the in-process filter's base model
    without its adapter (the training-free baseline on the same model), else the generator's."""
    if models.judge is not None:
        return models.judge
    if filter_role.endpoint is None:
        return replace(filter_role, adapter=None)
    return models.generator


def _filter_identity(filter_role: BackendSpec) -> dict[str, Any]:
    """What identifies the filter's answers (the cache key of its scores and replies)."""
    if filter_role.endpoint:
        return {"endpoint": filter_role.endpoint, "model": filter_role.model}
    from sieverag.inference.filters.adapter_files import adapter_content_hash

    return {"base": filter_role.model, "dtype": filter_role.dtype,
            "adapter": adapter_content_hash(filter_role.adapter or "")}


def _judge_state(backend: Any, examples: Sequence[Example], bar_n: float,
                 progress: bool, concurrency: int = 1) -> dict[str, Any]:
    decisions = methods.judge_decisions(backend, examples, bar_n, progress=progress,
                                        concurrency=concurrency)
    return {"kept": {k: list(v) for k, v in decisions.kept.items()},
            "scores": decisions.scores}


def _sentence_level(configs: Sequence[MCFConfig], backend: LLMBackend,
                    examples: Sequence[Example], decisions: Sequence[methods.ChunkDecisions],
                    progress: bool, combination: Combination | None = None,
                    concurrency: int = 1
                    ) -> tuple[dict[str, dict[str, set[tuple[str, int]]]], dict[str, int]]:
    """Row name → example id → kept (passage id, sentence index) pairs: every method's kept
    passages whole, each MCF row also with MCF's sentence stage, and the oracle rows; with
    the counts of MCF's sentence replies (answers, unparsed, none)."""
    staged, oracle = methods.mcf_sentence_results(backend, examples, configs,
                                                  combination=combination, progress=progress,
                                                  concurrency=concurrency)
    by_row = {methods.mcf_row_name(c): (c, results)
              for c, results in zip(configs, staged, strict=True)}
    rows: dict[str, dict[str, set[tuple[str, int]]]] = {}
    for decision in decisions:
        rows[decision.method + WHOLE] = {e.id: methods.whole_passages(e, decision.kept[e.id])
                                         for e in examples}
        if decision.method in by_row:
            mcf, results = by_row[decision.method]
            rows[methods.sentence_row_name(mcf)] = {
                e.id: methods.kept_sentences(results[e.id], e) for e in examples}
    gold_ids = {e.id: [d.id for d in e.documents if d.is_gold] for e in examples}
    rows[ORACLE_ALL] = {e.id: methods.whole_passages(e, gold_ids[e.id]) for e in examples}
    rows[f"oracle: gold passages → {methods.sentence_stage_name(configs[0])}"] = {
        e.id: methods.kept_sentences(oracle[e.id], e) for e in examples}
    statuses = list(methods.sentence_statuses([*staged, oracle]).values())
    parse = {"answers": len(statuses), "unparsed": statuses.count("unparsed"),
             "none": statuses.count("none") + statuses.count("none_dropped")}
    return rows, parse


def _comparison(chunk: Mapping[str, Mapping[str, float | None]], rules: Sequence[str],
                top_k: int, judge: bool = True) -> dict[str, dict[str, float | None]]:
    """For each MCF row: its chunk F1 minus each baseline's."""
    baselines = (*((JUDGE,) if judge else ()), f"BM25 top-{top_k}", f"dense top-{top_k}",
                 KEEP_ALL)
    result: dict[str, dict[str, float | None]] = {}
    for rule in rules:
        mine = chunk[rule]["f1"]
        result[rule] = {
            f"f1_minus_{method}": (None if mine is None or chunk[method]["f1"] is None
                                   else mine - chunk[method]["f1"])
            for method in baselines}
    return result
