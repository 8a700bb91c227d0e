"""The `sieverag` command line. Subcommands of `data_gen`, `training` and `serving` are found
through the `sieverag.commands` entry points, so `inference` imports none of them."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import fields
from importlib.metadata import entry_points
from pathlib import Path

from sieverag.inference.answers import ANSWER_EXTRACTIONS
from sieverag.inference.errors import ConfigError, SieveragError
from sieverag.inference.llm.models import DEFAULT_MODEL


def _add_backend_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("models")
    group.add_argument("--model", default=DEFAULT_MODEL,
                       help="generator (and filter) model: embedded name or local HF folder "
                            f"(default {DEFAULT_MODEL})")
    group.add_argument("--dtype", default="auto",
                       choices=["auto", "float32", "bfloat16", "float16"],
                       help="weights dtype for in-process models (auto: bf16 on GPU, fp32 on CPU)")
    group.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                       help="device for in-process models")
    group.add_argument("--batch-size", type=int, default=16, help="prompts per forward pass")
    group.add_argument("--generator-endpoint", help="OpenAI-compatible base URL of a served "
                       "generator (e.g. http://127.0.0.1:8000/v1); default: in-process")
    group.add_argument("--generator-model", help="served generator's model name")
    group.add_argument("--filter-endpoint", help="OpenAI-compatible base URL of a served filter")
    group.add_argument("--filter-model", help="served filter's model name (e.g. an adapter name)")
    group.add_argument("--api-key-env", help="environment variable holding the servers' API key")
    group.add_argument("--chat-template-model", help="local tokenizer folder or embedded name used "
                       "to render chat prompts for scoring on a served model")


def _backend_specs(args: argparse.Namespace) -> dict:
    from sieverag.inference.llm.registry import BackendSpec

    local = BackendSpec(kind="hf", model=args.model, dtype=args.dtype, device=args.device,
                        batch_size=args.batch_size)

    def served(endpoint: str | None, model: str | None, role: str) -> BackendSpec | None:
        if not endpoint:
            if model:
                raise ConfigError(f"--{role}-model needs --{role}-endpoint")
            return None
        if not model:
            raise ConfigError(f"--{role}-endpoint needs --{role}-model (the served model name)")
        return BackendSpec(kind="openai", model=model, endpoint=endpoint,
                           api_key_env=args.api_key_env,
                           chat_template_model=args.chat_template_model)

    generator = served(args.generator_endpoint, args.generator_model, "generator") or local
    return {"generator": generator,
            "filter": served(args.filter_endpoint, args.filter_model, "filter")}


def _defaults(config_class: type) -> dict:
    """A config dataclass's field defaults, so a flag's default is the config's own."""
    return {f.name: f.default for f in fields(config_class)}


def _add_amber_flags(parser: argparse.ArgumentParser) -> None:
    from sieverag.inference.filters.mcf import MCFConfig
    from sieverag.inference.pipelines.amber_config import AmberConfig

    amber, mcf = _defaults(AmberConfig), _defaults(MCFConfig)
    group = parser.add_argument_group(
        "amber loop and trained filter (defaults: the settings that measured best)")
    group.add_argument("--amber-filter", choices=["mcf", "judge", "stack", "none"],
                       default=amber["filter"], help="filter stage of the `amber` pipeline "
                       f"(default {amber['filter']}; amber-mcf, amber-judge, amber-stack, "
                       "amber-none fix it per pipeline)")
    group.add_argument("--filter-adapter", metavar="PATH_OR_NAME",
                       help="the trained filter, run in-process on the filter's model: an "
                       "adapter folder or the name of an installed or shipped filter "
                       "(`sieverag filter list`; default smollm2-filter: the one installed "
                       "under that name, else the shipped one; a served filter is "
                       "--filter-endpoint/--filter-model)")
    group.add_argument("--max-iterations", type=int, default=amber["max_iterations"],
                       help=f"amber rounds at most (default {amber['max_iterations']})")
    group.add_argument("--amber-k", type=int, default=amber["k"],
                       help=f"unseen documents taken per amber round (default {amber['k']})")
    group.add_argument("--answer-from", choices=["memory", "memory_and_evidence", "evidence"],
                       default=amber["answer_from"],
                       help=f"what amber's final answer reads (default {amber['answer_from']}: "
                            "a generator as small as SmolLM2 garbles its notes)")
    group.add_argument("--min-evidence", type=int, default=amber["min_evidence"],
                       help="amber reads the best-scored dropped chunks when it kept fewer "
                            f"than this (default {amber['min_evidence']}; 0: off)")
    group.add_argument("--stack-combine", choices=["both", "either", "zmean"], default="both",
                       help="how the stack filter combines MCF and the judge (default both)")
    group.add_argument("--mcf-bar", choices=["fixed", "adaptive", "top_k"], default=mcf["bar"],
                       help="MCF keeps s >= --mcf-threshold (fixed), s >= mean(s) over the "
                            "round (adaptive) or the --mcf-top-k best chunks (top_k); "
                            f"default {mcf['bar']}")
    group.add_argument("--mcf-top-k", type=int, default=mcf["top_k"],
                       help=f"chunks a round keeps under --mcf-bar top_k (default {mcf['top_k']})")
    group.add_argument("--mcf-lexical-weight", type=float, default=mcf["lexical_weight"],
                       help="fuse the filter's score with BM25 of the question: z(s) + "
                            "w·z(BM25) (adaptive or top_k bar only; 0: off; default 1 under "
                            "those bars, off under fixed)")
    group.add_argument("--mcf-threshold", type=float, default=mcf["threshold"],
                       help="fixed MCF bar on s = log P(Yes) - log P(No) "
                            f"(default {mcf['threshold']})")
    group.add_argument("--sentence-stage", action=argparse.BooleanOptionalAction,
                       default=mcf["sentence_stage"],
                       help="MCF narrows kept chunks to their key sentences (default: off, "
                            "whole chunks)")
    group.add_argument("--sufficiency-threshold", type=float, default=0.5,
                       help="the memory suffices when P(Yes) >= this (default 0.5)")


def _amber_sections(args: argparse.Namespace) -> dict:
    from sieverag.inference.collector import CollectorConfig
    from sieverag.inference.filters.mcf import MCFConfig
    from sieverag.inference.filters.stack import StackConfig
    from sieverag.inference.pipelines.amber_config import AmberConfig

    return {
        "mcf": MCFConfig(adapter=args.filter_adapter, bar=args.mcf_bar,
                         threshold=args.mcf_threshold, top_k=args.mcf_top_k,
                         lexical_weight=args.mcf_lexical_weight,
                         sentence_stage=args.sentence_stage),
        "amber": AmberConfig(
            filter=args.amber_filter, k=args.amber_k, max_iterations=args.max_iterations,
            answer_from=args.answer_from, min_evidence=args.min_evidence,
            stack=StackConfig(combine=args.stack_combine),
            collector=CollectorConfig(sufficiency_threshold=args.sufficiency_threshold)),
    }


def _default_out(prefix: str) -> Path:
    return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


def _print_summary(out: Path, summaries: dict) -> None:
    from sieverag.inference.eval.report import TRUST_COLUMNS, comparison_table

    print(comparison_table(summaries))
    print()
    print(comparison_table(summaries, TRUST_COLUMNS))
    print(f"\nresults: {out}/summary.json, {out}/report.md, {out}/results/")


def cmd_eval(args: argparse.Namespace) -> int:
    from sieverag.inference.config import (
        GenerationConfig,
        RetrievalConfig,
        RunConfig,
        TrustConfig,
        load_run_config,
    )
    from sieverag.inference.eval.runner import run_evaluation
    from sieverag.inference.filters.judge import JudgeConfig
    from sieverag.inference.router import RouterConfig

    if args.config:
        if args.dataset or args.pipeline:
            raise ConfigError("--config repeats a run as it was: drop --dataset/--pipeline")
        config = load_run_config(args.config)
    else:
        if not args.dataset or not args.pipeline:
            raise ConfigError("sieverag eval needs --dataset and --pipeline (or --config)")
        pipelines = tuple(p.strip() for value in args.pipeline for p in value.split(",")
                          if p.strip())
        config = RunConfig(
            dataset=args.dataset, pipelines=pipelines, dataset_format=args.format,
            limit=args.limit, question_ids=args.question_ids,
            max_documents=args.max_documents,
            generation=GenerationConfig(max_new_tokens=args.max_new_tokens),
            judge=JudgeConfig(bar_n=args.judge_n),
            answer_extraction=args.answer_extraction, seed=args.seed,
            retrieval=(RetrievalConfig(index=args.index, mode=args.mode, k=args.k)
                       if args.index else None),
            router=RouterConfig(self_check=args.router_self_check),
            routed_pipeline=args.routed_pipeline,
            trust=TrustConfig(enabled=not args.no_trust, llm_judge=args.llm_judge),
            **_backend_specs(args), **_amber_sections(args),
        )
    from sieverag.inference.pipelines import PIPELINES

    unknown = [p for p in config.pipelines if p not in PIPELINES]
    if unknown:
        raise ConfigError(f"unknown pipeline(s) {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(PIPELINES))})")
    if not Path(config.dataset).is_file():
        raise ConfigError(f"dataset file {config.dataset} not found")
    out = Path(args.out) if args.out else _default_out("eval")
    summaries = run_evaluation(config, out, progress=not args.quiet)
    _print_summary(out, summaries)
    return 0


DEMO_PIPELINES = ("direct", "vanilla", "main-rag", "amber-mcf")


def cmd_demo(args: argparse.Namespace) -> int:
    from sieverag.inference.config import RunConfig
    from sieverag.inference.demo_data import write_demo_dataset
    from sieverag.inference.eval.runner import run_evaluation, with_trained_filter
    from sieverag.inference.trace import find_record, render_record

    started = time.perf_counter()
    out = Path(args.out)
    # The demo shows the pipelines running: a fresh run each time, not a resumed one.
    shutil.rmtree(out / "run", ignore_errors=True)
    dataset = write_demo_dataset(out / "demo.jsonl", per_template=args.per_template)
    config = with_trained_filter(RunConfig(
        dataset=str(dataset), pipelines=DEMO_PIPELINES, limit=args.limit,
        **_backend_specs(args), **_amber_sections(args)))
    print(f"demo: {dataset} (invented facts: only the documents can answer them); amber "
          f"filters with the trained filter {config.mcf.adapter or config.filter.model}")
    summaries = run_evaluation(config, out / "run", progress=not args.quiet)
    _print_summary(out / "run", summaries)
    print()
    print(_demo_verdict(summaries["vanilla"], summaries["amber-mcf"]))
    print(_gold_first_line(out / "run" / "results" / "amber-mcf.jsonl"))
    first = json.loads(dataset.read_text(encoding="utf-8").splitlines()[0])["id"]
    print(f"\none question's amber trace (the demo set's first; `sieverag trace "
          f"{out / 'run'} ID --pipeline amber-mcf` shows any other):\n")
    print(render_record(find_record(out / "run", first, "amber-mcf")))
    print(f"\ndemo finished in {time.perf_counter() - started:.0f} s")
    return 0


def _gold_first_line(results: Path) -> str:
    """How often the filter's own score, BM25 and their fusion put the relevant document first
    in amber's first round: which part of MCF's score did the work."""
    firsts = {"the filter alone": 0, "BM25 alone": 0, "the fused score": 0}
    parts = {"the filter alone": "filter_score", "BM25 alone": "bm25", "the fused score": "score"}
    graded = 0
    for line in results.read_text(encoding="utf-8").splitlines():
        scored = json.loads(line)["trace"]["rounds"][0]["scored"]
        gold = [s for s in scored if s.get("is_gold")]
        if not gold or "bm25" not in gold[0]:
            continue
        graded += 1
        for name, key in parts.items():
            firsts[name] += all(gold[0][key] >= s[key] for s in scored)
    if not graded:
        return "(no fused filter scores to break down)"
    return ("relevant document ranked first in round 1: " + ", ".join(
        f"by {name} in {count} of {graded}" for name, count in firsts.items()))


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


def cmd_trace(args: argparse.Namespace) -> int:
    from sieverag.inference.trace import find_record, render_record

    print(render_record(find_record(args.run_dir, args.question_id, args.pipeline)))
    return 0


def cmd_ask(args: argparse.Namespace) -> int:
    from sieverag.inference.config import RetrievalConfig, RunConfig
    from sieverag.inference.eval.runner import build_context, with_trained_filter
    from sieverag.inference.pipelines import build_pipeline
    from sieverag.inference.trace import render_loop
    from sieverag.inference.types import Example

    if not Path(args.index).is_dir():
        raise ConfigError(f"index folder {args.index} not found; build one with "
                          "`sieverag index build`")
    # A one-question run: the same config and context as `sieverag eval`, without a dataset.
    config = with_trained_filter(RunConfig(
        dataset="", pipelines=(args.pipeline,),
        retrieval=RetrievalConfig(index=args.index, mode=args.mode, k=args.k),
        **_backend_specs(args), **_amber_sections(args)))
    context, _ = build_context(config)
    output = build_pipeline(args.pipeline, context).run(
        Example(id="ask", question=args.question, answers=()))
    print(f"Answer: {output.answer}")
    if output.raw_answer.strip() != output.answer:
        print(f"(raw reply: {output.raw_answer.strip()!r})")
    print(f"\nEvidence read ({len(output.documents_read)}):")
    for number, document in enumerate(output.documents_read, start=1):
        print(f"[{number}] {document.title or document.id}: {document.text}")
    if args.trace and "rounds" in output.trace:
        print()
        print(render_loop(output.trace))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sieverag", description="Filter what a RAG generator reads: evaluate pipelines, "
        "label data, train and serve the filter.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    evaluate = sub.add_parser("eval", help="run pipelines on a QA dataset and score them",
                              description="Run pipelines on a dataset; results are resumable.")
    evaluate.add_argument("--pipeline", action="append",
                          help="pipeline name(s): direct, vanilla, main-rag, amber, amber-mcf, "
                          "amber-judge, amber-stack, amber-none, auto "
                          "(repeat the flag or comma-separate)")
    evaluate.add_argument("--dataset", help="dataset file (hotpotqa, nq, popqa, squad, arc, "
                          "triviaqa, or common {question, answers, ctxs} jsonl)")
    evaluate.add_argument("--format", default="auto", help="dataset format (default: detect)")
    evaluate.add_argument("--limit", type=int, help="evaluate the first N examples only")
    evaluate.add_argument("--question-ids", metavar="FILE",
                          help="evaluate only the example ids listed in FILE, one a line (e.g. "
                               "build-dataset's validation_ids.txt); --limit applies after")
    evaluate.add_argument("--max-documents", type=int, help="read at most N documents per example")
    evaluate.add_argument("--max-new-tokens", type=int, default=32, help="answer length cap")
    evaluate.add_argument("--judge-n", type=float, default=0.0,
                          help="n of the MAIN-RAG judge bar τq = mean(r) − n·σ(r) (default 0)")
    evaluate.add_argument("--answer-extraction", default="first_sentence",
                          choices=ANSWER_EXTRACTIONS, help="how the scored answer is cut from "
                          "the reply (raw replies are kept too)")
    evaluate.add_argument("--seed", type=int, default=0, help="seed for any sampling")
    retrieval = evaluate.add_argument_group("retrieval and routing")
    retrieval.add_argument("--index", help="retrieve each question's documents from this index "
                           "(`sieverag index build`) instead of the dataset's own")
    retrieval.add_argument("--mode", default="hybrid", choices=["bm25", "dense", "hybrid", "rrf"],
                           help="retrieval mode with --index (default hybrid)")
    retrieval.add_argument("-k", type=int, default=5, help="documents retrieved per question")
    retrieval.add_argument("--routed-pipeline", default="vanilla",
                           help="what the `auto` pipeline runs when its router retrieves")
    retrieval.add_argument("--router-self-check", action="store_true",
                           help="the router also asks the model whether it can answer alone")
    trust = evaluate.add_argument_group("trust metrics")
    trust.add_argument("--no-trust", action="store_true",
                       help="skip the trust-aware metrics (faithfulness, support, quality)")
    trust.add_argument("--llm-judge", action="store_true",
                       help="also grade each answer 1-5 on six criteria with the generator")
    evaluate.add_argument("--config", help="repeat a run from its RUN_DIR/config.yaml")
    evaluate.add_argument("--out", help="run folder (default runs/eval-TIMESTAMP); rerunning "
                          "into it resumes")
    evaluate.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_amber_flags(evaluate)
    _add_backend_flags(evaluate)
    evaluate.set_defaults(func=cmd_eval)

    demo = sub.add_parser("demo", help="run direct, vanilla, main-rag and amber (with the "
                          "trained filter) on the built-in demo set",
                          description="Write the demo set, compare pipelines on it, and show "
                          "one question's amber trace.")
    demo.add_argument("--out", default="runs/demo", help="demo folder (default runs/demo)")
    demo.add_argument("--limit", type=int, help="first N demo questions only")
    demo.add_argument("--per-template", type=int, default=2,
                      help="questions per kind of fact (6 kinds; default 2: 12 questions, "
                           "about 2.5 minutes on 2 CPU cores)")
    demo.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_amber_flags(demo)
    _add_backend_flags(demo)
    demo.set_defaults(func=cmd_demo)

    trace = sub.add_parser("trace", help="show one question's saved result and amber trace",
                           description="Render one example of a run readably: answer, "
                           "metrics, every amber round, evidence, usage by agent.")
    trace.add_argument("run_dir", metavar="RUN_DIR", help="run folder of `sieverag eval`")
    trace.add_argument("question_id", metavar="QUESTION_ID", help="the example's id")
    trace.add_argument("--pipeline", default="amber",
                       help="which results/<pipeline>.jsonl to read (default amber)")
    trace.set_defaults(func=cmd_trace)

    ask = sub.add_parser("ask", help="answer one question over an index, with its evidence",
                         description="Answer one question from an index (`sieverag index "
                         "build`) and print the answer with the evidence it read.")
    ask.add_argument("question", help="the question")
    ask.add_argument("--index", required=True, help="index folder")
    ask.add_argument("--pipeline", default="amber",
                     help="pipeline: amber (default), amber-<filter>, vanilla, main-rag, direct")
    ask.add_argument("--mode", default="hybrid", choices=["bm25", "dense", "hybrid", "rrf"],
                     help="retrieval mode (default hybrid)")
    ask.add_argument("-k", type=int, default=5, help="documents retrieved for the question")
    ask.add_argument("--trace", action="store_true", help="also show amber's rounds")
    _add_amber_flags(ask)
    _add_backend_flags(ask)
    ask.set_defaults(func=cmd_ask)

    from sieverag.inference.filters.cli import register as register_filter
    from sieverag.inference.retrieval.cli import register as register_retrieval

    register_retrieval(sub)
    register_filter(sub)
    for command in entry_points(group="sieverag.commands"):
        command.load()(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SieveragError as err:
        print(f"sieverag: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sieverag: interrupted; finished results are saved, rerun the same command to "
              "resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
