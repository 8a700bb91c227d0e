"""`sieverag eval-filter` (registered through the `sieverag.commands` entry points)."""

from __future__ import annotations

import argparse
import shlex
import sys

from sieverag.inference.llm.models import DEFAULT_MODEL


def cmd_eval_filter(args: argparse.Namespace) -> int:
    from sieverag.training.filter_eval import FilterEvalConfig, run_filter_eval
    from sieverag.training.filter_report import CHUNK_COLUMNS, SENTENCE_COLUMNS, table

    config = FilterEvalConfig(
        dataset=args.dataset, out=args.out, adapter=args.adapter,
        filter_endpoint=args.filter_endpoint, filter_model=args.filter_model,
        api_key_env=args.api_key_env, base_model=args.base_model,
        exclude_training=tuple(args.exclude_training_questions or ()),
        question_ids_file=args.question_ids,
        allow_training_questions=args.allow_training_questions, limit=args.limit,
        threshold=args.threshold, top_k=args.top_k, judge_n=args.judge_n,
        lexical_weight=args.lexical_weight, embedding_model=args.embedding_model,
        batch_size=args.batch_size, device=args.device, dtype=args.dtype)
    command = "sieverag " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    report = run_filter_eval(config, progress=not args.quiet, command=command)
    questions = report["questions"]
    print(f"{questions['evaluated']} questions ({questions['excluded_as_training']} left out "
          f"as training questions)\n\nchunk level:\n{table(report['chunk'], CHUNK_COLUMNS)}")
    if report["sentence"]:
        print(f"\nsentence level ({questions['with_supporting_facts']} questions):\n"
              f"{table(report['sentence'], SENTENCE_COLUMNS)}")
    print(f"\nreport: {args.out}/report.md, {args.out}/report.json")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `eval-filter` to the `sieverag` command line."""
    parser = subparsers.add_parser(
        "eval-filter", help="score a trained filter against gold passages and baselines",
        description="Chunk-level P/R/F1 and AUROC against gold passages, sentence-level "
                    "P/R/F1 against supporting facts, for the trained filter, the MAIN-RAG "
                    "judge on the same base model, BM25 and dense top-k, and keep-all, on the "
                    "same held-out questions. Reruns into the same --out reuse finished work.")
    parser.add_argument("--dataset", required=True,
                        help="HotpotQA-format file (gold passages, optional supporting facts)")
    parser.add_argument("--adapter", help="trained LoRA adapter folder, or the name of an "
                        "installed or shipped filter (`sieverag filter list`), run in-process; "
                        "default: smollm2-filter")
    parser.add_argument("--filter-endpoint",
                        help="OpenAI-compatible base URL serving the filter (instead of "
                             "in-process), e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--filter-model", help="the served filter's model name")
    parser.add_argument("--api-key-env", help="environment variable holding the server's key")
    parser.add_argument("--base-model",
                        help="base model of the filter and of the judge baseline (default: "
                             f"the adapter's metadata, else {DEFAULT_MODEL})")
    which = parser.add_argument_group("which questions")
    which.add_argument("--exclude-training-questions", nargs="+", metavar="DATASET_DIR",
                       help="build-dataset folder(s) whose train-split questions are left out "
                            "(default: the questions listed in the adapter's card, else the "
                            "dataset it names)")
    which.add_argument("--question-ids", "--split", metavar="FILE",
                       help="evaluate only these question ids (one a line), e.g. a "
                            "validation split's ids")
    which.add_argument("--allow-training-questions", action="store_true",
                       help="evaluate although the training questions are unknown")
    which.add_argument("--limit", type=int, help="the first N eligible questions only")
    parser.add_argument("--threshold", type=float, default=0.5,
                        help="keep a passage when the filter's P(Yes) exceeds this (default 0.5)")
    parser.add_argument("--top-k", type=int, default=2,
                        help="k of the BM25 and dense baselines (default 2)")
    parser.add_argument("--judge-n", type=float, default=0.0,
                        help="n of the judge bar mean(r) - n*std(r) (default 0)")
    parser.add_argument("--lexical-weight", type=float, default=1.0,
                        help="w of the 'trained filter + BM25 prior' row, top-k of z(log-odds) "
                             "+ w*z(BM25) as MCF's --mcf-lexical-weight (default 1; 0: no row)")
    parser.add_argument("--embedding-model", default="all-minilm-l6-v2",
                        help="dense baseline's embedding model (default all-minilm-l6-v2)")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per forward pass")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--dtype", default="auto",
                        choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--out", default="runs/eval-filter", help="report folder "
                        "(default runs/eval-filter)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(func=cmd_eval_filter)
