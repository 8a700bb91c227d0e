"""`sieverag eval-filter`: the trained filter against gold passages and the baselines, its
tables printed and its reports written (see `sieverag.cli`)."""

from __future__ import annotations

import shlex
import sys
from dataclasses import field

from sieverag.inference.core.in_flight import CONCURRENCY_HELP
from sieverag.inference.core.settings import narrow, settings
from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig


@settings
class EvalFilterCommand(FilterEvalConfig):
    """Chunk-level P/R/F1 and AUROC against gold passages, sentence-level P/R/F1 against
    supporting facts, for the trained filter run through MCF, the MAIN-RAG judge on the same
    base model, BM25 and dense top-k, and keep-all, on the same held-out questions of each
    dataset, with a per-dataset table. Reruns into the same --out reuse finished work."""

    concurrency: int | None = field(default=None, metadata={"help": CONCURRENCY_HELP})
    quiet: bool = field(default=False, metadata={"help": "no progress bars"})


def run_eval_filter(command: EvalFilterCommand) -> int:
    from sieverag.training.evaluation.filter_eval import run_filter_eval
    from sieverag.training.evaluation.filter_report import (
        CHUNK_COLUMNS,
        SENTENCE_COLUMNS,
        summary_table,
        table,
    )

    config = narrow(command, FilterEvalConfig)
    invocation = "sieverag " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report = run_filter_eval(config, progress=not command.quiet, command=invocation,
                             concurrency=command.concurrency)
    questions = report["questions"]
    print(f"{questions['evaluated']} questions ({questions['excluded_as_training']} left out "
          f"as training questions)\n\nchunk level:\n{table(report['chunk'], CHUNK_COLUMNS)}")
    if report["sentence"]:
        print(f"\nsentence level ({questions['with_supporting_facts']} questions):\n"
              f"{table(report['sentence'], SENTENCE_COLUMNS)}")
    if len(report["datasets"]) > 1:
        print(f"\nby dataset:\n{summary_table(report['by_dataset'])}")
    if report["odd_passages"] is not None:
        print(f"\n{report['odd_passages']}")
    print(f"\nreport: {config.out}/report.md, {config.out}/report.json")
    return 0
