"""The runtime's commands: `eval`, `ask`, `demo`, `trace`, `judge-sweep`, `report`, `export`
(see `sieverag.cli`).

Each command is a settings class, its fields the command's flags and YAML keys, and a
`run_*` function. `eval`'s settings are a run config (`RunConfig`) plus where the results go,
so a run folder's config.yaml is a valid `--config`.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from dataclasses import asdict, field, replace
from pathlib import Path

from pydantic_settings import CliPositionalArg

from sieverag.inference.composition.compose import build_context, plan_run
from sieverag.inference.composition.config import (
    ModelRoles,
    RetrievalConfig,
    RunConfig,
    TrustConfig,
    models_field,
)
from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.in_flight import CONCURRENCY_HELP
from sieverag.inference.core.settings import narrow, settings
from sieverag.inference.data.dataset_fields import limit_field
from sieverag.inference.filters.card.filter_card import filter_role
from sieverag.inference.filters.judge import DocumentOrder
from sieverag.inference.pipelines.pipeline_registry import (
    PIPELINES,
    section_values,
    with_pipeline_sections,
)
from sieverag.inference.retrieval.config import IndexConfig
from sieverag.inference.retrieval.index_folder import SearchMode
from sieverag.inference.retrieval.search_backend import IndexAddress, IndexSource

DEMO_PIPELINES = ("direct", "vanilla", "main-rag", "amber-mcf")


@settings
class EvalCommand(RunConfig):
    """Run pipelines on a QA dataset and score them; rerunning into the same --out resumes,
    and `--config RUN/config.yaml` repeats a run (flags override it)."""

    out: str | None = field(default=None, metadata={
        "help": "run folder (default runs/eval-TIMESTAMP)"})
    concurrency: int | None = field(default=None, metadata={"help": CONCURRENCY_HELP})
    quiet: bool = field(default=False, metadata={"help": "no progress bar"})


@settings
@with_pipeline_sections
class DemoCommand:
    """Write the demo set (invented facts: only its documents can answer), compare direct,
    vanilla, main-rag and amber with the trained filter on it, show one amber trace."""

    out: str = field(default="runs/demo", metadata={"help": "demo folder"})
    limit: int | None = limit_field()
    per_template: int = field(default=2, metadata={
        "help": "questions per kind of fact (6 kinds; 2: 12 questions, about 2.5 minutes on "
                "2 CPU cores)"})
    quiet: bool = field(default=False, metadata={"help": "no progress bar"})
    models: ModelRoles = models_field()


@settings
@with_pipeline_sections
class AskCommand:
    """Answer one question from an index and print the answer with the evidence it read: an
    index folder (`--index DIR`, `sieverag index build`), `sieverag index serve`
    (`--retrieval.endpoint URL`) or a Milvus collection (`--retrieval.backend milvus
    --retrieval.uri URI`), as `sieverag eval` reads them."""

    question: CliPositionalArg[str] = field(metadata={"help": "the question"})
    index: str | None = field(default=None, metadata={
        "help": "index folder (or name a served or Milvus index in retrieval.*)"})
    pipeline: str = field(default="amber", metadata={
        "help": "the pipeline: " + ", ".join(sorted(PIPELINES))})
    mode: SearchMode = field(default="hybrid", metadata={"help": "retrieval mode"})
    k: int = field(default=5, metadata={"help": "documents retrieved for the question"})
    trace: bool = field(default=False, metadata={
        "help": "also show the pipeline's trace (amber: its rounds)"})
    models: ModelRoles = models_field()
    retrieval: IndexAddress = field(default_factory=IndexAddress, metadata={
        "help": "the index, when it is not a folder (--index): served or in Milvus"})

    def __post_init__(self) -> None:
        self.index_source()

    def index_source(self) -> IndexSource:
        """The index asked: the folder `--index`, or the one `retrieval` names."""
        return self.retrieval.source(self.index, "--index")


@settings
class TraceCommand:
    """Render one example of a run readably: answer, metrics, every amber round, evidence,
    usage by agent."""

    run_dir: CliPositionalArg[str] = field(metadata={"help": "run folder of `sieverag eval`"})
    question_id: CliPositionalArg[str] = field(metadata={"help": "the example's id"})
    pipeline: str = field(default="amber", metadata={
        "help": "which results/<pipeline>.jsonl to read"})


@settings
class JudgeSweepCommand:
    """MAIN-RAG's n·σ ablation from one run: for each n, recompute every question's bar
    τq = mean(r) − n·σ(r) over its stored judge scores and answer again with the run's
    generator from the documents kept (the judge is not asked again)."""

    run: str = field(metadata={"help": "run folder of `sieverag eval` with main-rag results"})
    # Not `n`: a one-letter field would be the flag `-n`, unlike every other flag.
    bar_n: tuple[float, ...] = field(metadata={
        "help": "the n values of τq = mean(r) − n·σ(r) to sweep, comma-separated (negative "
                "ones: --bar-n=-0.5,0,1)"})
    pipeline: str = field(default="main-rag", metadata={
        "help": "whose results/<pipeline>.jsonl holds the judge scores"})
    out: str | None = field(default=None, metadata={
        "help": "sweep folder (default RUN/judge-sweep-PIPELINE); rerunning into it resumes"})
    order: DocumentOrder | None = field(default=None, metadata={
        "help": "read the kept documents in this order instead of the run's judge.order "
                "(descending, ascending, random): the ordering ablation from the same scores"})
    concurrency: int | None = field(default=None, metadata={"help": CONCURRENCY_HELP})
    quiet: bool = field(default=False, metadata={"help": "no progress bar"})

    def __post_init__(self) -> None:
        if not self.bar_n:
            raise ConfigError("--bar-n: give at least one value, e.g. --bar-n 0,0.5,1,1.5")
        if not all(math.isfinite(v) for v in self.bar_n):
            raise ConfigError(f"--bar-n: every value must be a finite number, got "
                              f"{','.join(f'{v:g}' for v in self.bar_n)}")


def _default_out(prefix: str) -> Path:
    return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


def _print_summary(out: Path, summaries: dict) -> None:
    from sieverag.inference.eval.report import TRUST_COLUMNS, comparison_table

    print(comparison_table(summaries))
    print()
    print(comparison_table(summaries, TRUST_COLUMNS))
    print(f"\nresults: {out}/summary.json, {out}/report.md, {out}/results/\n"
          f"report: {out / 'report.html'} (every question, what each pipeline read, kept "
          "and answered; open it in a browser)")


def run_eval(command: EvalCommand) -> int:
    from sieverag.inference.eval.runner import run_evaluation
    from sieverag.inference.pipelines import PIPELINES

    config = narrow(command, RunConfig)
    unknown = [p for p in config.pipelines if p not in PIPELINES]
    if unknown:
        raise ConfigError(f"unknown pipeline(s) {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(PIPELINES))})")
    out = Path(command.out) if command.out else _default_out("eval")
    summaries = run_evaluation(config, out, progress=not command.quiet,
                               concurrency=command.concurrency)
    _print_summary(out, summaries)
    return 0


def run_demo(command: DemoCommand) -> int:
    from sieverag.inference.data.demo import write_demo_dataset
    from sieverag.inference.eval.runner import run_plan
    from sieverag.inference.eval.trace_rendering import find_record, render_record

    started = time.perf_counter()
    out = Path(command.out)
    # The demo shows the pipelines running: a fresh run each time, not a resumed one.
    shutil.rmtree(out / "run", ignore_errors=True)
    dataset = write_demo_dataset(out / "demo.jsonl", per_template=command.per_template)
    plan = plan_run(RunConfig(dataset=str(dataset), pipelines=DEMO_PIPELINES,
                              limit=command.limit, models=command.models,
                              **section_values(command)))
    trained = plan.trained_filter
    print(f"demo: {dataset} (invented facts: only the documents can answer them); amber "
          f"filters with the trained filter {trained.adapter or trained.model}\n{plan.ranking}")
    summaries = run_plan(plan, out / "run", progress=not command.quiet, announce=False)
    _print_summary(out / "run", summaries)
    print()
    print(_demo_verdict(summaries["vanilla"], summaries["amber-mcf"]))
    print(_gold_first_line(out / "run" / "results" / "amber-mcf.jsonl"))
    first = json.loads(dataset.read_text(encoding="utf-8").splitlines()[0])["id"]
    print(f"\none question's amber trace (the demo set's first; `sieverag trace "
          f"{out / 'run'} ID --pipeline amber-mcf` shows any other):\n")
    print(render_record(find_record(out / "run", first, "amber-mcf")))
    print()
    print(_bridge_demo(command, out))
    card = plan.filter_card
    if card is not None:
        print(f"\nwhat ranked: {filter_role(card.combination)}")
    print(f"\ndemo finished in {time.perf_counter() - started:.0f} s")
    # Last, so a terminal user finds it: the page showing every question of the demo.
    print(f"report: {out / 'run' / 'report.html'}")
    return 0


# The two-hop demo shows the loop's second round: the bar of "enough" is out of reach, so
# the loop runs both rounds (eval's default bar is 0.5).
BRIDGE_DEMO_SUFFICIENCY = 1.0


def _bridge_demo(command: DemoCommand, out: Path) -> str:
    """One two-hop question over a small BM25 index: amber-mcf, on the paper's loop, takes 2
    documents a round for 2 rounds, the second round's query led by a name the first round kept
    (bridge queries);
    returns its trace, as `sieverag trace` shows it."""
    from sieverag.inference.data.demo import write_bridge_demo
    from sieverag.inference.eval.runner import run_evaluation
    from sieverag.inference.eval.trace_rendering import find_record, render_record
    from sieverag.inference.retrieval.index_folder import build_index

    dataset, corpus = write_bridge_demo(out)
    index = out / "bridge-index"
    build_index(corpus, index, IndexConfig(dense=None), overwrite=True, show_progress=False)
    collector = replace(command.amber.collector, query_source="bridge",
                        sufficiency_threshold=BRIDGE_DEMO_SUFFICIENCY)
    # The paper's loop (adaptive off): the demo shows the second round, which the adaptive
    # loop skips whenever round 1 kept strong evidence.
    sections = {**section_values(command), "amber": replace(
        command.amber, k=2, max_iterations=2, collector=collector, adaptive=False)}
    config = RunConfig(dataset=str(dataset), pipelines=("amber-mcf",), limit=1,
                       retrieval=RetrievalConfig(index=str(index), mode="bm25", k=2),
                       models=command.models, trust=TrustConfig(enabled=False), **sections)
    shutil.rmtree(out / "bridge-run", ignore_errors=True)
    run_evaluation(config, out / "bridge-run", progress=False, announce=False)
    return (f"a two-hop question over an index ({corpus}, BM25): amber-mcf reads 2 documents "
            "a round for 2 rounds; the second query is led by a name the first round kept "
            f"(`sieverag trace {out / 'bridge-run'} bridge-0 --pipeline amber-mcf`):\n\n"
            + render_record(find_record(out / "bridge-run", "bridge-0", "amber-mcf")))


def _gold_first_line(results: Path) -> str:
    """How often the filter's own score, BM25 and their fusion put the relevant document first
    in amber's first round: which part of MCF's score did the work."""
    firsts = {"the filter alone": 0, "BM25 alone": 0, "the fused score": 0}
    parts = {"the filter alone": "filter_score", "BM25 alone": "bm25", "the fused score": "score"}
    from sieverag.inference.core.io_utils import JsonlLog
    from sieverag.inference.eval.result_records import EvalRecord
    from sieverag.inference.pipelines.amber.loop_trace import AmberTrace

    graded = 0
    for record in JsonlLog(results).read_records(EvalRecord):
        if not isinstance(record.trace, AmberTrace):
            continue
        scored = record.trace.rounds[0].scored
        gold = [s for s in scored if s.is_gold]
        if not gold or gold[0].bm25 is None:
            continue
        graded += 1
        for name, key in parts.items():
            if getattr(gold[0], key) is None:  # the filter was not called for chunks
                firsts.pop(name, None)
                continue
            if name in firsts:
                firsts[name] += all(getattr(gold[0], key) >= getattr(s, key) for s in scored)
    if not graded:
        return "(no fused filter scores to break down)"
    unread = ("" if "the filter alone" in firsts else
              " (the filter was not called for chunks: its card ranks by BM25 + dense)")
    return ("relevant document ranked first in round 1: " + ", ".join(
        f"by {name} in {count} of {graded}" for name, count in firsts.items()) + unread)


def _demo_verdict(vanilla: dict, amber: dict) -> str:
    """One line saying, from the figures, whether amber beat reading everything."""
    fewer = 1 - amber["generator_input_tokens_per_question"] / max(
        vanilla["generator_input_tokens_per_question"], 1e-9)
    figures = (f"accuracy {amber['accuracy']:.3f} vs {vanilla['accuracy']:.3f}, F1 "
               f"{amber['f1']:.3f} vs {vanilla['f1']:.3f}, its generator reading "
               f"{fewer:.0%} fewer tokens")
    if amber["accuracy"] > vanilla["accuracy"] or (
            amber["accuracy"] == vanilla["accuracy"] and amber["f1"] > vanilla["f1"]):
        return f"amber with the trained filter beats vanilla here: {figures}."
    return f"amber with the trained filter does NOT beat vanilla here: {figures}."


def run_trace(command: TraceCommand) -> int:
    from sieverag.inference.eval.trace_rendering import find_record, render_record

    print(render_record(find_record(command.run_dir, command.question_id, command.pipeline)))
    return 0


def run_judge_sweep(command: JudgeSweepCommand) -> int:
    from sieverag.inference.eval.judge_sweep import sweep_folder, sweep_judge_bar, sweep_table

    out = (Path(command.out) if command.out
           else sweep_folder(command.run, command.pipeline, command.order))
    ns = tuple(dict.fromkeys(command.bar_n))  # each n once, in the given order
    sweep = sweep_judge_bar(command.run, ns, command.pipeline, out, order=command.order,
                            progress=not command.quiet, concurrency=command.concurrency)
    print(sweep_table(sweep))
    print(f"\nresults: {out}/summary.json, {out}/results/")
    return 0


def run_ask(command: AskCommand) -> int:
    from sieverag.inference.core.types import Example
    from sieverag.inference.eval.trace_rendering import render_trace
    from sieverag.inference.pipelines import build_pipeline

    if command.index is not None and not Path(command.index).is_dir():
        raise ConfigError(f"index folder {command.index} not found; build one with "
                          "`sieverag index build`")
    # A one-question run: the same config and context as `sieverag eval`, without a dataset.
    retrieval = RetrievalConfig(**asdict(command.index_source()), mode=command.mode,
                                k=command.k)
    plan = plan_run(RunConfig(
        dataset="", pipelines=(command.pipeline,), retrieval=retrieval,
        models=command.models, **section_values(command)))
    if plan.ranking is not None:
        print(plan.ranking, file=sys.stderr)
    context, _ = build_context(plan)
    output = build_pipeline(command.pipeline, context).run(
        Example(id="ask", question=command.question, answers=()))
    print(f"Answer: {output.answer}")
    if output.raw_answer.strip() != output.answer:
        print(f"(raw reply: {output.raw_answer.strip()!r})")
    print(f"\nEvidence read ({len(output.documents_read)}):")
    for number, document in enumerate(output.documents_read, start=1):
        print(f"[{number}] {document.title or document.id}: {document.text}")
    if command.trace and output.trace:
        print()
        print(render_trace(output.trace))
    return 0


@settings
class ReportCommand:
    """The papers' tables across runs: per metric a row per pipeline and a column per dataset,
    then each run's own table; with --html, each run's report.html instead."""

    runs: tuple[str, ...] = field(metadata={
        "help": "run folders of `sieverag eval`, one dataset each, comma-separated"})
    out: str | None = field(default=None, metadata={
        "help": "also write the Markdown here (default: print only)"})
    html: bool = field(default=False, metadata={
        "help": "instead, write each run's report.html (every question, what each pipeline "
                "read, kept and answered; also for a run not finished) and print its path"})


def run_report(command: ReportCommand) -> int:
    from sieverag.inference.core.io_utils import write_atomic
    from sieverag.inference.eval.report import collate_runs

    if command.html:
        from sieverag.inference.eval.html_report import write_html_report

        if not command.runs:
            raise ConfigError("report --html needs at least one run folder (--runs DIR,...)")
        for run in command.runs:
            print(f"report: {write_html_report(run)}")
        return 0
    text = collate_runs(command.runs)
    if command.out:
        write_atomic(command.out, text + "\n")
    print(text)
    return 0


@settings
class ExportCommand:
    """Write a run's records as jsonl in the schema RAG-evaluation tools read (RAGAS): one
    line per (pipeline, question) with user_input, retrieved_contexts (the text the generator
    read), response, reference, pipeline and id. No sieverag figure is exported: RAGAS's own
    metrics (its LLM-judged context precision, faithfulness) are not the trust metrics of the
    same names."""

    run: str = field(metadata={"help": "run folder of `sieverag eval`"})
    out: str = field(metadata={"help": "jsonl file to write (replaced whole)"})
    pipelines: tuple[str, ...] = field(default=(), metadata={
        "help": "pipelines to export, comma-separated (default: every one the run has)"})


def run_export(command: ExportCommand) -> int:
    from sieverag.inference.eval.export import export_run

    counts = export_run(command.run, command.out, command.pipelines)
    print(f"wrote {sum(counts.values())} rows to {command.out} ("
          + ", ".join(f"{name}: {count}" for name, count in counts.items()) + ")")
    return 0
