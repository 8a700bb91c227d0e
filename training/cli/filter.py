"""`sieverag filter list | install | package`: the trained filters sieverag can find
(`filter fit-combination` is `training.evaluation.combination_fit`: it runs the filter over
datasets).

Each command is a settings class, its fields the command's flags and YAML keys, and a
`run_*` function (see `sieverag.cli`).
"""

from __future__ import annotations

from dataclasses import field

from pydantic_settings import CliPositionalArg

from sieverag.inference.core.settings import at_least, settings
from sieverag.inference.filters.adapters import DEFAULT_FILTER_NAME, AdapterError, read_card
from sieverag.inference.filters.combination import adapter_combination, describe_combination
from sieverag.inference.filters.filter_format import FORMAT_KEY


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


def _held_out_f1(card: dict | None) -> str:
    """Held-out chunk F1 of MCF's default: its worst source left out of the fit where the
    card's combination was chosen leave-one-source-out, else the card's eval-filter figure of
    the rule amber runs by default ("–" when the card has neither)."""
    fit = ((card or {}).get("combination") or {}).get("fit") or {}
    left_out = [row["default"]["f1"] for row in (fit.get("leave_one_source_out") or {}).values()
                if "default" in row]
    if left_out:
        return f"{min(left_out):.3f} worst"
    held_out = (card or {}).get("held_out") or {}
    figures = (held_out.get("chunk") or {}).get(held_out.get("amber_default_row") or "")
    return "–" if not figures or figures.get("f1") is None else f"{figures['f1']:.3f}"


def run_list(command: FilterListCommand) -> int:
    from sieverag.inference.filters.adapters import adapters_dir, available_adapters

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
              f"{_held_out_f1(card):12} {adapter.path}")
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
    from sieverag.inference.filters.adapters import install_adapter

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
