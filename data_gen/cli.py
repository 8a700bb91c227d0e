"""`sieverag label` and `sieverag build-dataset` (registered through `sieverag.commands`)."""

from __future__ import annotations

import argparse
import json

from sieverag.inference.errors import ConfigError
from sieverag.inference.llm.models import DEFAULT_MODEL


def cmd_label(args: argparse.Namespace) -> int:
    from sieverag.data_gen.labelling import LabelRunConfig, run_labelling
    from sieverag.data_gen.teacher import TeacherConfig

    if bool(args.teacher_endpoint) != bool(args.teacher_model):
        raise ConfigError("--teacher-endpoint and --teacher-model go together")
    teacher = None
    if args.teacher_endpoint:
        teacher = TeacherConfig(endpoint=args.teacher_endpoint, model=args.teacher_model,
                                api_key_env=args.teacher_key_env,
                                max_concurrency=args.teacher_concurrency,
                                timeout_s=args.teacher_timeout)
        teacher.backend_config()  # a bad URL fails here, before any work
    config = LabelRunConfig(
        dataset=args.dataset, out=args.out, dataset_format=args.format, limit=args.limit,
        scorer=None if args.scorer == "none" else args.scorer, cxmi_level=args.cxmi_level,
        batch_size=args.batch_size, device=args.device, teacher=teacher,
        max_documents=args.max_documents, borrowed_negatives=args.borrowed_negatives,
        seed=args.seed)
    summary = run_labelling(config, progress=not args.quiet)
    print(f"labelled {summary.questions_labelled} question(s) now, "
          f"{summary.questions_done_before} before; {summary.questions_total} in all")
    if summary.teacher:
        print("teacher: " + json.dumps(summary.teacher))
    _print_agreement(summary.gold_agreement)
    print(f"labels: {args.out}/labels.jsonl, summary: {args.out}/summary.json")
    return 0


def cmd_build_dataset(args: argparse.Namespace) -> int:
    from sieverag.data_gen.dataset import DatasetConfig, build_dataset, parse_mix
    from sieverag.data_gen.labels import LabelPolicy

    policy = LabelPolicy(chunk_rule=args.chunk_rule, sentence_rule=args.sentence_rule,
                         gold=args.gold, chunk_cxmi_threshold=args.chunk_cxmi_threshold,
                         sentence_cxmi_threshold=args.sentence_cxmi_threshold)
    config = DatasetConfig(
        labels=tuple(args.labels), out=args.out, policy=policy,
        mix=parse_mix(args.mix) if args.mix else None,
        chunk_positive_fraction=None if args.positive_fraction <= 0 else args.positive_fraction,
        validation_fraction=args.validation_fraction, seed=args.seed, tokenizer=args.tokenizer)
    summary = build_dataset(config, progress=not args.quiet)
    for split, counts in summary.counts.items():
        print(f"{split}: {counts} (chunk positives "
              f"{summary.chunk_positive_fraction[split]:.0%})")
    _print_agreement(summary.gold_agreement)
    print(f"dataset: {args.out}/dataset (save_to_disk), {args.out}/train.jsonl, "
          f"{args.out}/validation.jsonl, {args.out}/stats.json")
    return 0


def _print_agreement(agreement: dict) -> None:
    for level, signals in agreement.items():
        for name, scores in signals.items():
            print(f"gold agreement, {level:8s} {name:8s} precision {scores['precision']:.3f} "
                  f"recall {scores['recall']:.3f} F1 {scores['f1']:.3f} "
                  f"({scores['items']} items)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `label` and `build-dataset` to the `sieverag` command line."""
    from sieverag.data_gen.labels import CHUNK_RULES, GOLD_USES, SENTENCE_RULES, LabelPolicy

    defaults = LabelPolicy()

    label = subparsers.add_parser(
        "label", help="label chunks and sentences with STRINC, CXMI and a teacher",
        description="Label each question's chunks and sentences; output is resumable: "
                    "rerun the same command to continue.")
    label.add_argument("--dataset", required=True, help="dataset file (hotpotqa, nq, popqa, "
                       "squad, or common {question, answers, ctxs} jsonl)")
    label.add_argument("--out", required=True, help="label folder (rerunning into it resumes)")
    label.add_argument("--format", default="auto", help="dataset format (default: detect)")
    label.add_argument("--limit", type=int, help="label the first N questions only")
    label.add_argument("--scorer", default=DEFAULT_MODEL,
                       help=f"CXMI scorer: embedded name or local HF folder, or 'none' "
                            f"(default {DEFAULT_MODEL})")
    label.add_argument("--cxmi-level", default="both", choices=["chunk", "sentence", "both"],
                       help="score chunks, sentences or both with CXMI (default both)")
    label.add_argument("--batch-size", type=int, default=16, help="scorer batch size")
    label.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                       help="scorer device")
    label.add_argument("--teacher-endpoint", help="OpenAI-compatible base URL of the teacher")
    label.add_argument("--teacher-model", help="the teacher's model name")
    label.add_argument("--teacher-key-env", help="environment variable holding the teacher key")
    label.add_argument("--teacher-concurrency", type=int, default=8,
                       help="teacher requests in flight (default 8)")
    label.add_argument("--teacher-timeout", type=float, default=60.0,
                       help="seconds to wait for one teacher reply (default 60)")
    label.add_argument("--max-documents", type=int, help="label at most N chunks per question")
    label.add_argument("--borrowed-negatives", type=int, default=0,
                       help="add N chunks of other questions as negatives (for one-passage "
                            "data such as SQuAD and NQ oracle)")
    label.add_argument("--seed", type=int, default=0, help="seed for borrowed negatives")
    label.add_argument("--quiet", action="store_true", help="no progress bar")
    label.set_defaults(func=cmd_label)

    build = subparsers.add_parser(
        "build-dataset", help="turn label folders into the multi-task filter dataset",
        description="Apply the label policy, balance, mix and split by question; write "
                    "save_to_disk, jsonl and stats.json.")
    build.add_argument("--labels", required=True, nargs="+", help="label folder(s)")
    build.add_argument("--out", required=True, help="dataset folder (replaced when it exists)")
    build.add_argument("--mix", help="task shares, e.g. chunk=0.5,sentence=0.5 "
                       "(default: keep every record)")
    build.add_argument("--positive-fraction", type=float, default=0.5,
                       help="share of relevant chunk records; 0 keeps them as labelled "
                            "(default 0.5)")
    build.add_argument("--validation-fraction", type=float, default=0.1,
                       help="share of questions held out (default 0.1)")
    build.add_argument("--chunk-rule", default=defaults.chunk_rule, choices=CHUNK_RULES,
                       help="how a chunk's label is decided (see README: label policy)")
    build.add_argument("--sentence-rule", default=defaults.sentence_rule,
                       choices=SENTENCE_RULES,
                       help="how a relevant chunk's key sentences are decided")
    build.add_argument("--gold", default=defaults.gold, choices=GOLD_USES,
                       help="use the data's gold marks: prefer (default), ignore, only")
    build.add_argument("--chunk-cxmi-threshold", type=float,
                       default=defaults.chunk_cxmi_threshold,
                       help="chunk CXMI above this counts as positive "
                            f"(default {defaults.chunk_cxmi_threshold:g})")
    build.add_argument("--sentence-cxmi-threshold", type=float,
                       default=defaults.sentence_cxmi_threshold,
                       help="sentence CXMI above this counts as positive "
                            f"(default {defaults.sentence_cxmi_threshold:g})")
    build.add_argument("--tokenizer", default=DEFAULT_MODEL,
                       help="model whose tokenizer measures token lengths in stats.json")
    build.add_argument("--seed", type=int, default=0, help="seed of the split and sampling")
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    build.set_defaults(func=cmd_build_dataset)
