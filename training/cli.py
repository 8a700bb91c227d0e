"""The training commands: `sieverag train` and `sieverag eval-filter` (see `sieverag.cli`)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sieverag.inference.errors import ConfigError
from sieverag.inference.in_flight import CONCURRENCY_HELP
from sieverag.inference.settings import narrow, settings
from sieverag.training.filter_eval import FilterEvalConfig
from sieverag.training.launch import (
    LaunchConfig,
    Machine,
    check_launch,
    launch_environment,
    read_launch_config,
    resolve_accelerate_config,
    shipped_names,
)

RECIPES_DIR = Path(__file__).parent / "recipes"


@settings
class TrainCommand:
    """LoRA-train the filter: `accelerate launch -m sieverag.training.sft` with a shipped
    accelerate config and a recipe (TRL's SFTConfig and the filter's script and LoRA
    settings), as `trl sft` does. The recipe, the dataset and the config's fit to this
    machine are checked before anything is launched."""

    recipe: str = field(metadata={
        "help": "a shipped recipe's name (smollm2_filter_cpu, llama3_8b_filter_zero2) or a "
                "recipe YAML file"})
    accelerate_config: str = field(default="cpu", metadata={
        "help": "accelerate config: " + shipped_names() + " (shipped; ddp, zero2 and zero3 "
                "pick their CPU file on a machine without CUDA) or a YAML file"})
    num_processes: int | None = field(default=None, metadata={
        "help": "processes (GPUs, or CPU processes) to launch; default: the accelerate "
                "config's"})
    overrides: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "recipe fields to override, e.g. max_steps=2,learning_rate=1e-4 (in YAML, "
                "a mapping of any values)"})


@dataclass(frozen=True)
class LaunchPlan:
    """A checked launch: the command line, its environment and what it trains with."""

    argv: list[str]
    env: dict[str, str]
    config: LaunchConfig
    processes: int
    effective_batch: int


def recipe_path(recipe: str) -> Path:
    """A shipped recipe by name, else a recipe file."""
    shipped = RECIPES_DIR / f"{recipe}.yaml"
    if shipped.is_file():
        return shipped
    path = Path(recipe)
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
        raise ConfigError(f"recipe {recipe!r} is neither a shipped recipe ({names}) nor a file")
    return path


def plan_launch(command: TrainCommand, machine: Machine | None = None) -> LaunchPlan:
    """The `accelerate launch` that trains `command`'s recipe, checked first: the recipe and
    its overrides, the dataset's splits, and the accelerate config against `machine` (default:
    this one)."""
    from sieverag.training.data import load_training_splits
    from sieverag.training.recipe import parse_recipe

    machine = machine or Machine.detect()
    recipe_args = ["--config", str(recipe_path(command.recipe))]
    for name, value in command.overrides.items():
        recipe_args += [f"--{name}", str(value)]
    recipe = parse_recipe(recipe_args)  # a bad recipe or override fails here
    if command.num_processes is not None and command.num_processes < 1:
        raise ConfigError(f"--num-processes must be >= 1, got {command.num_processes}")
    config = read_launch_config(
        resolve_accelerate_config(command.accelerate_config, machine), command.accelerate_config)
    processes = command.num_processes or config.num_processes
    args = recipe.training
    check_launch(config, processes, bool(args.bf16), bool(args.fp16), machine)
    load_training_splits(recipe.script.dataset_path, recipe.script.train_split,
                         recipe.script.eval_split if args.eval_strategy != "no" else None)
    launch = [sys.executable, "-m", "accelerate.commands.launch",
              "--config_file", str(config.path)]
    if command.num_processes is not None:
        launch += ["--num_processes", str(command.num_processes)]
    return LaunchPlan(
        argv=[*launch, "-m", "sieverag.training.sft", *recipe_args],
        env=launch_environment(config, processes, machine), config=config,
        processes=processes,
        effective_batch=args.per_device_train_batch_size * args.gradient_accumulation_steps
        * processes)


def launch_command(command: TrainCommand) -> list[str]:
    """The `accelerate launch` command line that trains `command`'s recipe, checked first."""
    return plan_launch(command).argv


def run_train(command: TrainCommand) -> int:
    plan = plan_launch(command)
    where = "CPU" if plan.config.use_cpu else "GPU"
    print(f"launching: {' '.join(shlex.quote(a) for a in plan.argv)}\n"
          f"{plan.processes} {where} process(es); effective batch {plan.effective_batch} "
          "(per_device_train_batch_size x gradient_accumulation_steps x processes)",
          flush=True)
    return subprocess.run(plan.argv, env=plan.env, check=False).returncode


@settings
class EvalFilterCommand(FilterEvalConfig):
    """Chunk-level P/R/F1 and AUROC against gold passages, sentence-level P/R/F1 against
    supporting facts, for the trained filter run through MCF, the MAIN-RAG judge on the same
    base model, BM25 and dense top-k, and keep-all, on the same held-out questions of each
    dataset, with a per-dataset table. Reruns into the same --out reuse finished work."""

    concurrency: int | None = field(default=None, metadata={"help": CONCURRENCY_HELP})
    quiet: bool = field(default=False, metadata={"help": "no progress bars"})


def run_eval_filter(command: EvalFilterCommand) -> int:
    from sieverag.training.filter_eval import run_filter_eval
    from sieverag.training.filter_report import (
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
    print(f"\nreport: {config.out}/report.md, {config.out}/report.json")
    return 0
