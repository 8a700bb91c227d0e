"""Run pipelines over a dataset: resumable per-example jsonl, summary.json, report.md and
report.html.

A run folder holds `config.yaml` (the resolved config plus provenance), `results/<pipeline>.jsonl`
(one line per finished example, appended as it finishes), `summary.json`, `report.md` and
`report.html` (`html_report`: every question, what each pipeline read, kept and answered).
Rerunning into the same folder skips finished examples; a different config is refused.
"""

from __future__ import annotations

import importlib.metadata
import json
import random
import sys
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from sieverag.inference.composition.compose import (
    Roles,
    RunPlan,
    build_context,
    plan_run,
    with_dataset_home,
)
from sieverag.inference.composition.config import RunConfig, load_run_config
from sieverag.inference.core.errors import ConfigError, DatasetError
from sieverag.inference.core.in_flight import default_concurrency, run_in_flight
from sieverag.inference.core.io_utils import (
    JsonlLog,
    check_output_folder,
    read_text,
    write_atomic,
)
from sieverag.inference.core.prompt_templates import PROMPTS_DIR, load_template
from sieverag.inference.core.types import Example
from sieverag.inference.data import (
    PassageHandling,
    dataset_fingerprint,
    load_examples,
    odd_passages_line,
)
from sieverag.inference.eval.html_report import write_html_report
from sieverag.inference.eval.report import write_report
from sieverag.inference.eval.result_records import (
    EvalRecord,
    HygieneRemoval,
    build_record,
    trust_metrics,
)
from sieverag.inference.eval.summary import summarize
from sieverag.inference.filters.mcf import MCFConfig, window_rule
from sieverag.inference.llm.backend_protocol import measured
from sieverag.inference.llm.call_batching import question_batcher, warn_capped_requests
from sieverag.inference.llm.context_guard import context_guard_of
from sieverag.inference.pipelines import build_pipeline
from sieverag.inference.retrieval.hygiene import HygieneLog


def read_question_ids(path: str | Path) -> list[str]:
    """The ids listed in `path`, one a line (blank lines ignored)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"question ids file {path} not found")
    ids = [line.strip() for line in read_text(path).splitlines()]
    ids = [i for i in ids if i]
    if not ids:
        raise DatasetError(f"question ids file {path} lists no id")
    return ids


def selected_examples(plan: RunPlan) -> list[Example]:
    """The run's examples: the dataset (or the listed ids of it, in dataset order), first N.
    Their documents may be absent where the run retrieves, or reads none."""
    config, require_documents = plan.config, plan.reads_given_documents
    if config.question_ids is None:
        return load_examples(config.dataset, config.dataset_format, config.limit,
                             require_documents=require_documents)
    wanted = read_question_ids(config.question_ids)
    examples = [e for e in load_examples(config.dataset, config.dataset_format,
                                         require_documents=require_documents)
                if e.id in set(wanted)]
    missing = sorted(set(wanted) - {e.id for e in examples})
    if missing:
        raise DatasetError(f"{config.question_ids}: {len(missing)} listed id(s) are not in "
                           f"{config.dataset}, e.g. {missing[0]!r}")
    return examples[:config.limit]


def provenance(plan: RunPlan, home_line: str | None = None) -> dict:
    """Where and with what a run was made: prompt hashes, data fingerprint, the card the
    filter ranked by (`RunPlan.filter_card`), what ranked and why (with the dataset's home
    decision, `home_line`, where one was made), versions."""
    config = plan.config
    versions = {}
    for package in ("sieverag", "torch", "transformers"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    # The card the filter ranked by, served or in-process (a served filter without one
    # fails here, before the run writes its config.yaml).
    card = plan.filter_card.card if plan.filter_card is not None else None
    return {
        "dataset_sha256": dataset_fingerprint(config.dataset),
        "question_ids_sha256": (dataset_fingerprint(config.question_ids)
                                if config.question_ids else None),
        "filter_adapter": dict(card) if card is not None else None,
        # What ranked and why (the line the run printed at start): report.html shows it.
        "ranking": (plan.ranking if home_line is None
                    else f"{plan.ranking}\n{home_line}"),
        "prompt_sha256": {
            p.stem: load_template(p.stem).sha256[:16] for p in sorted(PROMPTS_DIR.glob("*.yaml"))
        },
        "versions": versions,
    }


def passage_handling(plan: RunPlan, roles: Roles) -> PassageHandling:
    """What a run does with the odd passages of its questions (`odd_passages_line`): its
    pipelines are given them as they are; a trained filter does not read blank ones and
    reads one longer than its window in windows; without one, a generator that checks its
    context cuts the prompt of a passage longer than that context to fit."""
    card = plan.filter_card
    if card is not None and roles.filter is not None:
        rule = window_rule(roles.filter, plan.settings(MCFConfig), card.combination)
        return PassageHandling(
            blank="given to the pipelines as they are, not read by the trained filter "
                  "(P(relevant) 0)",
            duplicate="given again", long="read by the trained filter in windows",
            window=f"the filter's window of {rule.window_tokens} tokens", fits=rule.fits)
    guard = context_guard_of(roles.generator)
    if guard is None:
        return PassageHandling(blank="given to the pipelines as they are", duplicate="given again")
    return PassageHandling(
        blank="given to the pipelines as they are", duplicate="given again",
        long="cut to fit it", window=f"the generator's context of {guard.context_length} tokens",
        fits=guard.holds)


def _check_same_run(config: RunConfig, out_dir: Path) -> None:
    existing_path = out_dir / "config.yaml"
    if not existing_path.exists():
        return
    existing = load_run_config(existing_path).without_provenance()
    if existing != config.without_provenance():
        raise ConfigError(
            f"{out_dir} holds a run with a different configuration: use another --out, or "
            f"repeat that run with `sieverag eval --config {existing_path}`"
        )


def run_evaluation(config: RunConfig, out_dir: str | Path, *, progress: bool = True,
                   concurrency: int | None = None, announce: bool = True) -> dict:
    """Run every pipeline of `config` on its dataset into `out_dir`; returns the summaries:
    `run_plan` of its plan (`plan_run`)."""
    return run_plan(plan_run(config), out_dir, progress=progress, concurrency=concurrency,
                    announce=announce)


def run_plan(plan: RunPlan, out_dir: str | Path, *, progress: bool = True,
             concurrency: int | None = None, announce: bool = True) -> dict:
    """Run every pipeline of `plan` on its dataset into `out_dir`; returns the summaries. What
    the run does is the plan's (`plan_run` decided it): the roles, the grader, the documents.

    `concurrency`: questions in flight (`inference.in_flight`; unset: 16 when every model is
    served, 1 when any runs in-process); in-process models then batch the questions' calls
    together (`llm.call_batching`). Records are appended as questions finish and the results come
    out in dataset order, whatever the concurrency. `announce`: say first (stderr) which
    score the trained filter ranks by, and why (`RunPlan.ranking`), where a pipeline calls
    it, and where the run reads the dataset's passages, the line counting its odd ones
    (`odd_passages_line`, `passage_handling`)."""
    out_dir = Path(out_dir)
    check_output_folder(out_dir)
    config = plan.config
    concurrency = default_concurrency(concurrency, plan.all_served)
    examples = selected_examples(plan)
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise DatasetError(f"{config.dataset}: example id {duplicate!r} appears more than once")
    _check_same_run(config, out_dir)
    # A dataset of the filter's home text ranks every round at home (said at start).
    plan, home_line = with_dataset_home(plan, examples, Path(config.dataset).stem)
    # Finished results are read before any model loads: a bad line fails at once.
    logs = {name: JsonlLog(out_dir / "results" / f"{name}.jsonl") for name in config.pipelines}
    wanted = set(ids)
    finished = {name: [r for r in log.read_records(EvalRecord) if r.id in wanted]
                for name, log in logs.items()}
    write_atomic(out_dir / "config.yaml",
                 replace(config, provenance=provenance(plan, home_line)).to_yaml())
    warn_capped_requests(plan.model_specs, concurrency)
    if announce and plan.ranking is not None:
        print(plan.ranking, file=sys.stderr)
    if announce and home_line is not None:
        print(home_line, file=sys.stderr)

    random.seed(config.seed)
    import torch

    torch.manual_seed(config.seed)
    hygiene = HygieneLog() if plan.logs_hygiene else None
    with question_batcher(concurrency, plan.all_served) as batcher:
        context, roles = build_context(plan, removed=hygiene, batcher=batcher)
        if announce and plan.reads_given_documents:
            odd = odd_passages_line([replace(e, documents=tuple(context.documents(e)))
                                     for e in examples], passage_handling(plan, roles))
            if odd is not None:
                print(odd, file=sys.stderr)
        embed = None
        if config.trust.enabled:
            from sieverag.inference.retrieval.dense import DenseConfig, make_encoder

            embed = make_encoder(DenseConfig(model=config.trust.embedding_model,
                                             device=config.trust.embedding_device))
        all_records: dict[str, list[EvalRecord]] = {}
        for name in config.pipelines:
            pipeline = build_pipeline(name, context)
            log, records = logs[name], finished[name]
            done = {r.id for r in records}
            todo = [e for e in examples if e.id not in done]

            def answer(example: Example, pipeline=pipeline) -> EvalRecord:
                """One question, in its own thread: its usage is its own (`question_usage`)."""
                output, used, seconds = measured(lambda: pipeline.run(example))
                record = build_record(example, output, used, seconds)
                if hygiene is not None:  # what this thread's searches removed
                    record.hygiene_removed = [HygieneRemoval(id=chunk_id, reason=reason)
                                              for chunk_id, reason in hygiene.take()]
                if config.trust.enabled:
                    record.trust = trust_metrics(example, output, embed, config.trust,
                                                 roles.grader)
                return record

            def keep(example: Example, record: EvalRecord, log=log, records=records) -> None:
                log.append(record.to_json())
                records.append(record)

            with tqdm(desc=name, unit="q", disable=not progress, initial=len(done),
                      total=len(examples)) as bar:
                run_in_flight(todo, answer, keep, concurrency=concurrency,
                              name=lambda e: repr(e.id), bar=bar)
            order = {example_id: i for i, example_id in enumerate(ids)}
            all_records[name] = sorted(records, key=lambda r: order[r.id])
    summaries = {name: summarize(records) for name, records in all_records.items()}
    graded = ({"grader": {"model": plan.grader.model,
                          "self_graded": plan.grader == config.models.generator}}
              if plan.grader is not None else {})
    write_atomic(
        out_dir / "summary.json",
        json.dumps({"dataset": config.dataset, **graded, "pipelines": summaries},
                   indent=2) + "\n",
    )
    write_report(out_dir, config.dataset, summaries, all_records)
    write_html_report(out_dir, examples)
    return summaries
