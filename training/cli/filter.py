"""`sieverag filter list | install | package | fit-combination`: the trained filters sieverag
can find, their install and packaging, and the fit of a filter card's combination and home
rule (`training.evaluation.card_fit`: it runs the filter over datasets).

Each command is a settings class, its fields the command's flags and YAML keys, and a
`run_*` function (see `sieverag.cli`).
"""

from __future__ import annotations

from dataclasses import field, replace

from pydantic_settings import CliPositionalArg

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.in_flight import CONCURRENCY_HELP, check_concurrency
from sieverag.inference.core.settings import FileList, at_least, settings
from sieverag.inference.core.types import Device
from sieverag.inference.data import odd_passages_line
from sieverag.inference.data.dataset_fields import limit_field
from sieverag.inference.filters.adapter_files import AdapterError
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME
from sieverag.inference.filters.card.card_file import read_card
from sieverag.inference.filters.card.combination import (
    DEFAULT_EMBEDDING_MODEL,
    adapter_combination,
    card_combination,
)
from sieverag.inference.filters.card.filter_card import (
    describe_combination,
    describe_home,
    held_out_f1,
)
from sieverag.inference.filters.filter_format import FORMAT_KEY
from sieverag.inference.filters.home import DEFAULT_HOME_READ
from sieverag.training.evaluation.fit_defaults import DEFAULT_TOLERANCE, FOLDS, MIN_GAIN


@settings
class FilterListCommand:
    """Show the trained filter adapters found by name, where each comes from (the cache or
    shipped with sieverag), which one a name picks, its held-out F1, and how MCF combines
    its score with BM25 and dense (the fitted weights, and what the filter adds)."""


@settings
class FilterInstallCommand:
    """Copy an adapter's files (adapter_config.json, adapter_model.safetensors,
    sieverag_adapter.json) into $SIEVERAG_CACHE/adapters/NAME after checking them. Installed
    as 'smollm2-filter', a retrained filter replaces the shipped one everywhere."""

    path: CliPositionalArg[str] = field(metadata={
        "help": "adapter folder (e.g. a training output)"})
    name: str | None = field(default=None, metadata={
        "help": "name in the cache (default: the folder's name)"})


@settings
class FilterPackageCommand:
    """Write the adapter of a training output folder as a shippable filter: bf16 weights
    (checked against the float32 ones), a config naming the base model publicly, and a card
    with the base weights' and prompt templates' sha256, the training data, the recipe and the
    held-out quality."""

    run_dir: CliPositionalArg[str] = field(metadata={
        "help": "output folder of `-m sieverag.training.sft`"})
    out: str = field(metadata={
        "help": "folder to write (e.g. inference/filters/shipped/smollm2-filter)"})
    name: str = field(default=DEFAULT_FILTER_NAME, metadata={"help": "the filter's name"})
    eval_filter: str | None = field(default=None, metadata={
        "help": "an `eval-filter --out` folder whose figures go into the card"})
    check_passages: int = field(default=200, metadata={
        "help": "validation passages scored by both the bf16 and float32 adapters"})

    def __post_init__(self) -> None:
        at_least(1, check_passages=self.check_passages)


def run_list(command: FilterListCommand) -> int:
    from sieverag.inference.filters.adapter_store import adapters_dir, available_adapters

    found = available_adapters()
    if not found:
        print(f"no filter adapters found (cache: {adapters_dir()})")
        return 0
    print(f"{'name':24} {'source':8} {'by name':9} {'base model':24} {'format':10} "
          f"{'held-out F1':12} path")
    for adapter, picked in found:
        card = read_card(adapter.path)
        base = (card or {}).get("base_model", "–")
        print(f"{adapter.name:24} {adapter.source:8} {'yes' if picked else 'shadowed':9} "
              f"{base:24} {(card or {}).get(FORMAT_KEY, 'two_stage'):10} "
              f"{held_out_f1(card):12} {adapter.path}")
    print("\nHow MCF combines each filter's score with BM25 and dense (its card's "
          "combination):")
    for adapter, _ in found:
        try:
            described = describe_combination(adapter_combination(adapter.path))
        except AdapterError as err:
            described = str(err)
        print(f"  {adapter.name} ({adapter.source}): " + described.replace("\n", "\n    "))
    print("\nformat: one_pass reads each sentence's and the passage's verdict in one forward "
          "pass; two_stage a chunk prompt, then a generating sentence prompt.")
    print(f"\nA name is looked up in the cache ({adapters_dir()}) first, then among the "
          f"shipped filters; MCF uses {DEFAULT_FILTER_NAME!r} unless given another.")
    return 0


def run_install(command: FilterInstallCommand) -> int:
    from sieverag.inference.filters.adapter_store import install_adapter

    target = install_adapter(command.path, command.name)
    print(f"installed {command.path} as {target.name!r}: {target}")
    return 0


def run_package(command: FilterPackageCommand) -> int:
    from sieverag.inference.filters.packaging import package_filter

    packaged = package_filter(command.run_dir, command.out, name=command.name,
                              eval_dir=command.eval_filter,
                              check_passages=command.check_passages)
    print(f"packaged {command.run_dir} as {command.name!r} in {packaged.folder}: weights "
          f"{packaged.weights_bytes:,} bytes (bfloat16); P(Yes) of the bf16 adapter within "
          f"{packaged.max_p_yes_diff:.2e} of the trained one on {packaged.passages_checked} "
          f"passages ({packaged.check_dtype} base on {packaged.check_device})")
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
    from sieverag.inference.filters.adapter_store import find_adapter, resolve_filter
    from sieverag.inference.filters.card.card_file import CARD_FILE, read_card
    from sieverag.training.evaluation.card_fit import (
        fit_card_home,
        fitting_passage_handling,
        home_sources_of,
        score_fitting_rounds,
        write_card_combination,
        write_card_home,
    )
    from sieverag.training.evaluation.combination_fit import (
        fitting_questions,
        measure_combination,
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
