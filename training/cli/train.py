"""The training commands: `sieverag train` and `sieverag eval-filter` (see `sieverag.cli`)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic_settings import CliPositionalArg

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.in_flight import CONCURRENCY_HELP, check_concurrency
from sieverag.inference.core.settings import FileList, at_least, narrow, settings
from sieverag.inference.core.types import Device
from sieverag.inference.data import odd_passages_line
from sieverag.inference.data.dataset_fields import limit_field
from sieverag.inference.filters.combination import (
    DEFAULT_EMBEDDING_MODEL,
    card_combination,
    describe_combination,
)
from sieverag.inference.filters.home import DEFAULT_HOME_READ, describe_home
from sieverag.training.evaluation.card_fit import (
    FOLDS,
    MIN_GAIN,
    fit_card_home,
    fit_trained_filter,
    fitting_passage_handling,
    home_sources_of,
    not_fitted,
    score_fitting_rounds,
    write_card_combination,
    write_card_home,
)
from sieverag.training.evaluation.combination_fit import fitting_questions, measure_combination
from sieverag.training.evaluation.filter_eval_config import FilterEvalConfig
from sieverag.training.evaluation.home_fit import DEFAULT_TOLERANCE
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


@settings
class FitCombinationCommand:
    """Fit MCF's combination of the filter's score with BM25 and dense (logistic regression,
    calibrated), its calibrated bar, and what the filter adds over the priors alone, on
    held-out questions; write them into the adapter's card (`filter list` shows them)."""

    adapter: CliPositionalArg[str] = field(metadata={
        "help": "the filter: an adapter folder, or a name (an installed or shipped filter; "
                "its folder's card is rewritten)"})
    dataset: FileList = field(metadata={
        "help": "gold-marked dataset file(s) (as eval-filter reads them), comma-separated"})
    split_dir: str | None = field(default=None, metadata={
        "help": "a build-dataset folder: fit only on its validation questions (the filter's "
                "validation split)"})
    limit: int | None = limit_field()
    folds: int = field(default=FOLDS, metadata={"help": "cross-validation folds (by question)"})
    min_gain: float = field(default=MIN_GAIN, metadata={
        "help": "AUROC the filter must add over the priors alone to be used"})
    by_left_out_source: bool = field(default=False, metadata={
        "help": "fit on all sources but one and measure on the one left out, for each in "
                "turn; use the filter only if that makes its worst left-out source better "
                "than the priors alone (needs 2 datasets or more)"})
    embedding_model: str = field(default=DEFAULT_EMBEDDING_MODEL, metadata={
        "help": "the dense prior's embedding model"})
    scores: str | None = field(default=None, metadata={
        "help": "a JSONL file the scored passages are kept in: a rerun (another --limit, "
                "--min-gain, another source left out) reads the questions already scored "
                "from it instead of running the filter again"})
    home_sources: str = field(default="card", metadata={
        "help": "the filter's home text, whose questions fit the home rule (the filter's "
                "score read where a round looks like home; the other datasets are the away "
                "text it is told from): card (the sources the card's training records came "
                "from), comma-separated source names, or none (no home rule)"})
    keep_combination: bool = field(default=False, metadata={
        "help": "keep the card's combination (the away default) and fit only the home rule: "
                "the filter scores the home questions and only those away questions the home "
                "test would call home"})
    home_read: int = field(default=DEFAULT_HOME_READ, metadata={
        "help": "passages a home round's filter reads: the best by BM25 + dense"})
    home_tolerance: float = field(default=DEFAULT_TOLERANCE, metadata={
        "help": "F1 an away source may lose, against the away default, where the home test "
                "calls its rounds home (the test's bar is the lowest that keeps every away "
                "source within it)"})
    device: Device = field(default="auto", metadata={"help": "auto, cpu or cuda"})
    concurrency: int | None = field(default=None, metadata={"help": CONCURRENCY_HELP})
    quiet: bool = field(default=False, metadata={"help": "no progress bars"})

    def __post_init__(self) -> None:
        if not self.dataset:
            raise ConfigError("--dataset: give at least one dataset file")
        at_least(1, "--", home_read=self.home_read)
        if not 0 <= self.home_tolerance < 1:
            raise ConfigError(f"--home-tolerance must be in [0, 1), got {self.home_tolerance}")
        check_concurrency(self.concurrency)
        if self.folds < 2:
            raise ConfigError(f"--folds must be >= 2, got {self.folds}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {self.limit}")
        if not 0 <= self.min_gain < 1:
            raise ConfigError(f"--min-gain must be in [0, 1), got {self.min_gain}")




def run_fit_combination(command: FitCombinationCommand) -> int:
    from sieverag.inference.filters.adapters import (
        CARD_FILE,
        find_adapter,
        read_card,
        resolve_filter,
    )

    found = find_adapter(command.adapter)
    card = read_card(found.path)
    if card is None or "base_model" not in card:
        raise ConfigError(f"{found.path} has no {CARD_FILE} naming its base model: package "
                          "the filter first (`sieverag filter package`)")
    folder = resolve_filter(str(found.path), card["base_model"])
    by_dataset = fitting_questions(command.dataset, card, adapter=command.adapter,
                                   split_dir=command.split_dir, limit=command.limit)
    odd = odd_passages_line([e for chunk in by_dataset.values() for e in chunk],
                            fitting_passage_handling(card))
    if odd is not None:
        print(odd)
    scoring = {"embedding_model": command.embedding_model, "device": command.device,
               "concurrency": command.concurrency, "progress": not command.quiet,
               "scores_file": command.scores}
    if command.keep_combination:
        combination = card_combination(card, f"{folder}")
        if not combination.fitted:
            raise ConfigError(f"--keep-combination: the card of {folder} holds no fitted "
                              "combination to keep; fit one (leave the flag out)")
    else:
        rounds = score_fitting_rounds(folder, card, by_dataset, **scoring)
        combination = measure_combination(rounds, folds=command.folds,
                                          min_gain=command.min_gain,
                                          embedding_model=command.embedding_model,
                                          by_left_out_source=command.by_left_out_source)
        path = write_card_combination(folder, card, combination, list(by_dataset), rounds)
        card = read_card(folder) or card
        print(describe_combination(combination))
        print(f"written into {path}")
    home_sources = (home_sources_of(card) if command.home_sources == "card"
                    else [] if command.home_sources == "none"
                    else [s.strip() for s in command.home_sources.split(",") if s.strip()])
    if home_sources:
        home = fit_card_home(folder, card, by_dataset, replace(combination, home=None),
                             home_sources=home_sources, read=command.home_read,
                             tolerance=command.home_tolerance, **scoring)
        path = write_card_home(folder, card, home)
        print(describe_home(home))
        print(f"written into {path}")
    return 0
