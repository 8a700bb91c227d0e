"""`sieverag judge-sweep`: MAIN-RAG's n·σ ablation from one run's stored judge scores, for a
pipeline whose records hold them under one bar τq (`register_pipeline(judge_sweep=True)`).

For each n, every question's bar τq = mean(r) − n·σ(r) is recomputed over the judge scores r
its record holds, the documents with r ≥ τq are kept and put in the run's `judge.order`
(`judge_selection`, the rule the judge itself applies), and Agent-3 — the run's generator,
through the `Reader` main-rag uses — answers again from them. The judge is never asked
again, so the only model loaded is the generator. Documents are recovered by id from the
run's own document source (the dataset's documents, or the index it retrieved from): the
run's dataset and index must still be where its config.yaml says, and the dataset unchanged.
With n the run's own `judge.bar_n`, the kept documents are the run's, in the run's order.
`order` reads them in another order instead (MAIN-RAG's ordering ablation, from the same
scores): the sweep then answers at the same kept sets, read descending, ascending or shuffled.

The sweep folder (default RUN/judge-sweep-<pipeline>, `-<order>` added for `order`) holds
`sweep.json` (which run, pipeline and order it sweeps), `results/n=<n>.jsonl` (one
`EvalRecord` per question, appended as it finishes, so rerunning resumes) and
`summary.json` (`summarize` per n: EM, F1, accuracy, documents read — the kept ones — and
their precision/recall against the gold marks). A record's usage and seconds are Agent-3's
alone; trust metrics are not computed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from sieverag.inference.composition.compose import build_context, plan_run
from sieverag.inference.composition.config import RunConfig, load_run_config
from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.in_flight import default_concurrency, run_in_flight
from sieverag.inference.core.io_utils import (
    JsonlLog,
    check_output_folder,
    parse_json,
    read_text,
    write_atomic,
)
from sieverag.inference.core.types import Document, Example
from sieverag.inference.data import dataset_fingerprint
from sieverag.inference.eval.report import comparison_table
from sieverag.inference.eval.result_records import EvalRecord, build_record
from sieverag.inference.eval.runner import selected_examples
from sieverag.inference.eval.summary import summarize
from sieverag.inference.filters.judge import DocumentOrder, judge_selection
from sieverag.inference.llm.backend_protocol import measured
from sieverag.inference.llm.call_batching import question_batcher
from sieverag.inference.pipelines.pipeline_registry import (
    PIPELINES,
    DocumentSource,
    PipelineOutput,
    Reader,
    question_text,
)

# Entries of a stored scored document that are not the filter's evidence for it.
_NOT_DETAILS = {"id", "title", "score", "kept", "is_gold"}
SWEEP_COLUMNS = (
    ("em", "EM"),
    ("f1", "F1"),
    ("accuracy", "Acc"),
    ("choice_accuracy", "MC acc"),
    ("documents_read_per_question", "Kept docs"),
    ("read_precision", "Read P"),
    ("read_recall", "Read R"),
    ("read_f1", "Read F1"),
)


@dataclass(frozen=True)
class JudgedQuestion:
    """One question of the run: its example, and the judge's documents, scores and evidence
    (each in the order the judge read them)."""

    example: Example
    documents: tuple[Document, ...]
    scores: tuple[float, ...]
    details: tuple[dict, ...]


def bar_label(n: float) -> str:
    """The name of one n's results: `n=0.5`."""
    return f"n={n:g}"


def sweep_folder(run_dir: str | Path, pipeline: str, order: str | None = None) -> Path:
    """The default sweep folder: RUN/judge-sweep-<pipeline>[-<order>] (an order given
    instead of the run's own)."""
    return Path(run_dir) / f"judge-sweep-{pipeline}{f'-{order}' if order else ''}"


def sweepable() -> list[str]:
    """The registered pipelines whose records hold judge scores r under one bar τq over all
    their documents (`register_pipeline(judge_sweep=True)`)."""
    return sorted(name for name, entry in PIPELINES.items() if entry.judge_sweep)


def swept_pipeline(pipeline: str | None) -> str:
    """`pipeline`, or where none is given the one registered pipeline a sweep may run; a
    ConfigError for a pipeline it may not (naming those it may)."""
    allowed = sweepable()
    if pipeline is None:
        if len(allowed) != 1:
            raise ConfigError(f"name the pipeline to sweep (--pipeline): one of "
                              f"{', '.join(allowed) or 'none registered'}")
        return allowed[0]
    if pipeline not in allowed:
        raise ConfigError(
            f"--pipeline {pipeline}: its records hold no judge scores under one bar τq; "
            f"judge-sweep recomputes the bar of {', '.join(allowed) or 'no registered pipeline'}")
    return pipeline


def load_run(run_dir: Path, pipeline: str) -> tuple[RunConfig, list[EvalRecord]]:
    """The run's config and its finished records of `pipeline` (which must be sweepable)."""
    if not run_dir.is_dir():
        raise ConfigError(f"--run {run_dir}: no such folder; give a run folder written by "
                          "`sieverag eval`")
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"--run {run_dir}: holds no config.yaml; is it a run folder written "
                          "by `sieverag eval`?")
    config = load_run_config(config_path)
    pipeline = swept_pipeline(pipeline)
    results = run_dir / "results" / f"{pipeline}.jsonl"
    if not results.is_file():
        known = sorted(p.stem for p in (run_dir / "results").glob("*.jsonl"))
        raise ConfigError(f"{results} not found: the run in {run_dir} has no {pipeline} "
                          f"results (it has: {', '.join(known) or 'none'}); run "
                          f"`sieverag eval --pipelines {pipeline}` first")
    records = JsonlLog(results).read_records(EvalRecord)
    if not records:
        raise ConfigError(f"{results} holds no finished question to sweep")
    unscored = next((r for r in records if r.filter is None), None)
    if unscored is not None:
        raise DatasetError(f"{results}: question {unscored.id!r} has no judge scores (no "
                           f"`filter` entry); was the file written by {pipeline}?")
    return config, records


def judged_questions(config: RunConfig, records: Sequence[EvalRecord],
                     examples: Sequence[Example], documents_of: DocumentSource,
                     results: Path) -> list[JudgedQuestion]:
    """Each record's question with its scored documents, recovered by id from the run's
    document source `documents_of` (an `Example` → its documents)."""
    by_id = {e.id: e for e in examples}
    questions = []
    for record in records:
        example = by_id.get(record.id)
        if example is None:
            raise DatasetError(f"{results}: question {record.id!r} is not among the run's "
                               f"examples of {config.dataset}; was the dataset changed?")
        given = {d.id: d for d in documents_of(example)}
        missing = [s.id for s in record.filter.scores if s.id not in given]
        if missing:
            raise DatasetError(
                f"{results}: question {record.id!r} was judged on document {missing[0]!r}, "
                "which the run's document source no longer gives (was the dataset, "
                "--max-documents or the index changed?)")
        entries = record.filter.scores
        questions.append(JudgedQuestion(
            example=example, documents=tuple(given[s.id] for s in entries),
            scores=tuple(s.score for s in entries),
            details=tuple(s.model_dump(exclude_unset=True, exclude=_NOT_DETAILS)
                          for s in entries)))
    return questions


def _check_unchanged_dataset(config: RunConfig, run_dir: Path) -> None:
    recorded = config.provenance.get("dataset_sha256")
    if recorded is None:
        return
    current = dataset_fingerprint(config.dataset)
    if current != recorded:
        raise DatasetError(f"{config.dataset} changed since the run in {run_dir} (sha256 "
                           f"{current}, the run's {recorded}): the sweep must read the run's "
                           "own data; restore it, or sweep a new run")


def _check_same_sweep(out: Path, identity: dict) -> None:
    """Refuse to resume into a folder holding another run's (or pipeline's) sweep."""
    path = out / "sweep.json"
    if not path.is_file():
        return
    existing = parse_json(read_text(path, ConfigError), str(path), error=ConfigError)
    if existing != identity:
        raise ConfigError(f"{out} holds a sweep of another run or pipeline ({path}); use "
                          "another --out")


def sweep_judge_bar(run_dir: str | Path, ns: Sequence[float], pipeline: str | None = None,
                    out: str | Path | None = None, *, order: DocumentOrder | None = None,
                    progress: bool = True, concurrency: int | None = None) -> dict:
    """Answer the run's `pipeline` questions again (unset: the one registered pipeline a
    sweep may run, `swept_pipeline`) for each n in `ns`, reading the kept documents in
    `order` (default: the run's `judge.order`; see the module docstring); returns what
    OUT/summary.json holds: the run and pipeline, the `judge_order` used, the run's
    `run_bar_n`, and each n's summary under `bars` by `bar_label`. `concurrency`: questions
    in flight, as `sieverag eval` runs them (`inference.in_flight`)."""
    run_dir = Path(run_dir)
    pipeline = swept_pipeline(pipeline)
    config, records = load_run(run_dir, pipeline)
    if order is not None:
        config = replace(config, judge=replace(config.judge, order=order))
    out = Path(out) if out is not None else sweep_folder(run_dir, pipeline, order)
    check_output_folder(out)
    identity = {"run": str(run_dir.resolve()), "pipeline": pipeline,
                "judge_order": config.judge.order}
    _check_same_sweep(out, identity)
    _check_unchanged_dataset(config, run_dir)
    # Only the generator is needed: the judge's role shares its backend, so no judge loads.
    config = replace(config, pipelines=(pipeline,), models=replace(config.models, judge=None))
    plan = plan_run(config)
    concurrency = default_concurrency(concurrency, plan.all_served)
    examples = selected_examples(plan)
    summaries: dict[str, dict] = {}
    with question_batcher(concurrency, plan.all_served) as batcher:
        context, _ = build_context(plan, batcher=batcher)
        reader = Reader(context)
        questions = judged_questions(config, records, examples, context.documents,
                                     run_dir / "results" / f"{pipeline}.jsonl")
        write_atomic(out / "sweep.json", json.dumps(identity, indent=2) + "\n")
        for n in ns:
            label = bar_label(n)
            log = JsonlLog(out / "results" / f"{label}.jsonl")
            wanted = {q.example.id for q in questions}
            finished = {r.id: r for r in log.read_records(EvalRecord) if r.id in wanted}
            judge = replace(config.judge, bar_n=n)

            def answer(question: JudgedQuestion, judge=judge) -> EvalRecord:
                example = question.example
                result = judge_selection(question_text(example), question.documents,
                                         question.scores, question.details, judge)
                kept = tuple(result.kept_documents)
                (answer, raw), used, seconds = measured(lambda: reader.answer(example, kept))
                return build_record(example, PipelineOutput(answer=answer, raw_answer=raw,
                                                            documents_read=kept,
                                                            filter_result=result),
                                    used, seconds)

            def keep(question: JudgedQuestion, record: EvalRecord, log=log,
                     finished=finished) -> None:
                log.append(record.to_json())
                finished[record.id] = record

            with tqdm(desc=label, unit="q", disable=not progress, initial=len(finished),
                      total=len(questions)) as bar:
                run_in_flight([q for q in questions if q.example.id not in finished], answer,
                              keep, concurrency=concurrency,
                              name=lambda q: repr(q.example.id), bar=bar)
            summaries[label] = summarize([finished[q.example.id] for q in questions])
    sweep = {**identity, "run_bar_n": config.judge.bar_n, "bars": summaries}
    write_atomic(out / "summary.json", json.dumps(sweep, indent=2) + "\n")
    return sweep


def sweep_table(sweep: dict) -> str:
    """A sweep (`sweep_judge_bar`'s result) as one Markdown table, a row per n, the run's own
    n marked."""
    run_label = bar_label(sweep["run_bar_n"])
    rows = {(f"{label} (the run's)" if label == run_label else label): summary
            for label, summary in sweep["bars"].items()}
    return comparison_table(rows, SWEEP_COLUMNS)
