"""`sieverag label` and `sieverag build-dataset` (see `sieverag.cli`).

Each command's settings are the run's config (`LabelRunConfig`, `DatasetConfig`) plus
`quiet`, so its flags, a YAML `--config` and the Python API share one definition.
"""

from __future__ import annotations

import json
from dataclasses import field

from sieverag.data_gen.dataset import DatasetConfig
from sieverag.data_gen.labelling import LabelRunConfig
from sieverag.data_gen.passages import PassageSetConfig
from sieverag.inference.core.settings import narrow, settings


@settings
class LabelCommand(LabelRunConfig):
    """Label each question's chunks and sentences with STRINC, CXMI and a teacher; output is
    resumable: rerun the same command to continue."""

    quiet: bool = field(default=False, metadata={"help": "no progress bar"})


@settings
class BuildDatasetCommand(DatasetConfig):
    """Apply the label policy, balance, mix and split by question; write save_to_disk, jsonl
    and stats.json (the output folder is replaced when it exists)."""

    quiet: bool = field(default=False, metadata={"help": "no progress bar"})


@settings
class HardNegativesCommand(PassageSetConfig):
    """Write a passage set: each question's own passages plus the retriever's hard negatives
    from the source's corpus (common-format jsonl, input of `label` and `eval-filter`)."""


def run_hard_negatives(command: HardNegativesCommand) -> int:
    from sieverag.data_gen.passages import mine_passages

    summary = mine_passages(narrow(command, PassageSetConfig))
    print(f"{summary.source}: {summary.questions} questions, {summary.passages} passages "
          f"({summary.gold} gold, {summary.negatives} hard negatives, {summary.unmarked} "
          f"unmarked), shape {summary.shape} -> {command.out}")
    if summary.short_of_negatives:
        print(f"{summary.short_of_negatives} question(s) got fewer than {command.negatives} "
              "negatives (the retriever found too few passages without the answer)")
    if summary.odd_passages is not None:
        print(summary.odd_passages)
    return 0


def run_label(command: LabelCommand) -> int:
    from sieverag.data_gen.labelling import run_labelling

    if command.teacher is not None:
        command.teacher.backend_config()  # a bad URL fails here, before any work
    summary = run_labelling(narrow(command, LabelRunConfig), progress=not command.quiet)
    if summary.teacher_batch_input is not None:
        print(f"teacher requests written to {summary.teacher_batch_input}: run them, e.g. "
              f"`vllm run_batch -i {summary.teacher_batch_input} -o OUT.jsonl --model MODEL "
              f"--served-model-name {command.teacher.model}` (or through a Batch API), then "
              "rerun this command with --teacher.batch-output OUT.jsonl")
        return 0
    print(f"labelled {summary.questions_labelled} question(s) now, "
          f"{summary.questions_done_before} before; {summary.questions_total} in all")
    if summary.odd_passages is not None:
        print(summary.odd_passages)
    if summary.teacher:
        print("teacher: " + json.dumps(summary.teacher))
    _print_agreement(summary.gold_agreement)
    print(f"labels: {command.out}/labels.jsonl, summary: {command.out}/summary.json")
    return 0


def run_build_dataset(command: BuildDatasetCommand) -> int:
    from sieverag.data_gen.dataset import build_dataset

    summary = build_dataset(narrow(command, DatasetConfig), progress=not command.quiet)
    for split, counts in summary.counts.items():
        print(f"{split}: {counts} (chunk positives "
              f"{summary.chunk_positive_fraction[split]:.0%}); by source "
              f"{summary.sources[split]}")
    if not sum(summary.counts["validation"].values()):
        print(f"note: the validation split is empty ({summary.questions.get('validation', 0)} "
              "question(s) held out): train with eval_strategy: 'no', or raise "
              "--validation-fraction or label more questions")
    _print_agreement(summary.gold_agreement)
    print(f"dataset: {command.out}/dataset (save_to_disk), {command.out}/train.jsonl, "
          f"{command.out}/validation.jsonl, {command.out}/stats.json")
    return 0


def _print_agreement(agreement: dict) -> None:
    for level, signals in agreement.items():
        for name, scores in signals.items():
            print(f"gold agreement, {level:8s} {name:8s} precision {scores['precision']:.3f} "
                  f"recall {scores['recall']:.3f} F1 {scores['f1']:.3f} "
                  f"({scores['items']} items)")
