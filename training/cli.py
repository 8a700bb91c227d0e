"""The training commands: `sieverag train` and `sieverag eval-filter` (see `sieverag.cli`)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import field
from pathlib import Path
from typing import Any

from sieverag.accelerate_configs import ACCELERATE_CONFIG_NAMES, ACCELERATE_CONFIGS_DIR
from sieverag.inference.errors import ConfigError
from sieverag.inference.settings import narrow, settings
from sieverag.training.filter_eval import FilterEvalConfig

RECIPES_DIR = Path(__file__).parent / "recipes"


@settings
class TrainCommand:
    """LoRA-train the filter: `accelerate launch -m sieverag.training.sft` with a shipped
    accelerate config and a recipe (TRL's SFTConfig and the filter's script and LoRA
    settings), as `trl sft` does. The recipe is checked before anything is launched."""

    recipe: str = field(metadata={
        "help": "a shipped recipe's name (smollm2_filter_cpu, llama3_8b_filter_zero2) or a "
                "recipe YAML file"})
    accelerate_config: str = field(default="cpu", metadata={
        "help": "accelerate config: " + ", ".join(ACCELERATE_CONFIG_NAMES) + " (shipped) or "
                "a YAML file"})
    num_processes: int | None = field(default=None, metadata={
        "help": "processes (GPUs) to launch; default: the accelerate config's"})
    overrides: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "recipe fields to override, e.g. max_steps=2,learning_rate=1e-4 (in YAML, "
                "a mapping of any values)"})


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


def accelerate_config_path(name: str) -> Path:
    """A shipped accelerate config by name, else a config file."""
    if name in ACCELERATE_CONFIG_NAMES:
        return ACCELERATE_CONFIGS_DIR / ACCELERATE_CONFIG_NAMES[name]
    path = Path(name)
    if not path.is_file():
        raise ConfigError(f"accelerate config {name!r} is neither a shipped config "
                          f"({', '.join(ACCELERATE_CONFIG_NAMES)}) nor a file")
    return path


def launch_command(command: TrainCommand) -> list[str]:
    """The `accelerate launch` command line that trains `command`'s recipe, checked first."""
    from sieverag.training.recipe import parse_recipe

    recipe_args = ["--config", str(recipe_path(command.recipe))]
    for name, value in command.overrides.items():
        recipe_args += [f"--{name}", str(value)]
    parse_recipe(recipe_args)  # a bad recipe or override fails here, before the launch
    launch = [sys.executable, "-m", "accelerate.commands.launch",
              "--config_file", str(accelerate_config_path(command.accelerate_config))]
    if command.num_processes is not None:
        launch += ["--num_processes", str(command.num_processes)]
    return [*launch, "-m", "sieverag.training.sft", *recipe_args]


def run_train(command: TrainCommand) -> int:
    argv = launch_command(command)
    print("launching: " + " ".join(shlex.quote(a) for a in argv), flush=True)
    return subprocess.run(argv, check=False).returncode


@settings
class EvalFilterCommand(FilterEvalConfig):
    """Chunk-level P/R/F1 and AUROC against gold passages, sentence-level P/R/F1 against
    supporting facts, for the trained filter run through MCF, the MAIN-RAG judge on the same
    base model, BM25 and dense top-k, and keep-all, on the same held-out questions of each
    dataset, with a per-dataset table. Reruns into the same --out reuse finished work."""

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
    report = run_filter_eval(config, progress=not command.quiet, command=invocation)
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
