"""`sieverag train`: the checked `accelerate launch` of a recipe, then the fit of the trained
filter's card (see `sieverag.cli`)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import settings
from sieverag.training.evaluation.card_fit import fit_trained_filter, not_fitted
from sieverag.training.sft.launch import (
    LaunchConfig,
    Machine,
    check_launch,
    launch_environment,
    node_arguments,
    read_launch_config,
    resolve_accelerate_config,
    shipped_names,
)

RECIPES_DIR = Path(__file__).parents[1] / "sft" / "recipes"


@settings
class TrainCommand:
    """LoRA-train the filter: `accelerate launch -m sieverag.training.sft` with a shipped
    accelerate config and a recipe (TRL's SFTConfig and the filter's script and LoRA
    settings), as `trl sft` does. The recipe, the dataset and the config's fit to this
    machine are checked before anything is launched."""

    recipe: str = field(metadata={
        "help": "a shipped recipe's name (smollm2_filter_cpu, llama3_8b_filter_zero2, "
                "llama3_8b_filter_zero3, qwen2_5_7b_filter_zero3, ...) or a recipe YAML file"})
    accelerate_config: str = field(default="cpu", metadata={
        "help": "accelerate config: " + shipped_names() + " (shipped; ddp, zero2 and zero3 "
                "pick their CPU file on a machine without CUDA) or a YAML file"})
    num_processes: int | None = field(default=None, metadata={
        "help": "processes (GPUs, or CPU processes) to launch; default: the accelerate "
                "config's"})
    overrides: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "recipe fields to override, e.g. max_steps=2,learning_rate=1e-4 (in YAML, "
                "a mapping of any values)"})
    machine_rank: int | None = field(default=None, metadata={
        "help": "this machine's rank in a launch over several machines (an accelerate config "
                "with num_machines > 1, e.g. zero3_2x8): 0 on the main machine, 1, 2, ... on "
                "the others, each running the same command"})
    main_process_ip: str | None = field(default=None, metadata={
        "help": "the main machine's (rank 0's) address, which every machine of a multi-node "
                "launch reaches"})
    main_process_port: int | None = field(default=None, metadata={
        "help": "the port the main machine listens on (default: the config's, else 29500)"})
    dry_run: bool = field(default=False, metadata={
        "help": "check everything and print the launch command, launching nothing"})
    fit_combination: bool = field(default=True, metadata={
        "help": "after training, fit MCF's combination of the filter's score with BM25 and "
                "dense on the dataset's validation questions (each source left out in turn "
                "where it has two or more) and write it into the adapter's card, as `sieverag "
                "filter fit-combination` does; off (or where none can be fitted) the card "
                "holds none and MCF ranks by the filter's own score"})


@dataclass(frozen=True)
class LaunchPlan:
    """A checked launch: the command line, its environment and what it trains with."""

    argv: list[str]
    env: dict[str, str]
    config: LaunchConfig
    processes: int
    effective_batch: int
    dataset_path: str  # the build-dataset folder it trains on
    output_dir: str  # where it writes the adapter and its card


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
    from sieverag.training.sft.data import load_training_splits
    from sieverag.training.sft.recipe import parse_recipe

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
    launch += node_arguments(config, command.machine_rank, command.main_process_ip,
                             command.main_process_port)
    return LaunchPlan(
        argv=[*launch, "-m", "sieverag.training.sft", *recipe_args],
        env=launch_environment(config, processes, machine), config=config,
        processes=processes,
        effective_batch=args.per_device_train_batch_size * args.gradient_accumulation_steps
        * processes, dataset_path=str(recipe.script.dataset_path), output_dir=args.output_dir)


def launch_command(command: TrainCommand) -> list[str]:
    """The `accelerate launch` command line that trains `command`'s recipe, checked first."""
    return plan_launch(command).argv


def run_train(command: TrainCommand) -> int:
    plan = plan_launch(command)
    where = "CPU" if plan.config.use_cpu else "GPU"
    print(f"{'would launch (--dry-run)' if command.dry_run else 'launching'}: "
          f"{' '.join(shlex.quote(a) for a in plan.argv)}\n"
          f"{plan.processes} {where} process(es); effective batch {plan.effective_batch} "
          "(per_device_train_batch_size x gradient_accumulation_steps x processes)",
          flush=True)
    if command.dry_run:
        return 0
    code = subprocess.run(plan.argv, env=plan.env, check=False).returncode
    if code != 0:
        return code
    print(fit_trained_filter(plan.output_dir, plan.dataset_path,
                             device="cpu" if plan.config.use_cpu else "auto")
          if command.fit_combination
          else not_fitted(plan.output_dir, plan.dataset_path, "--no-fit-combination"))
    return 0
