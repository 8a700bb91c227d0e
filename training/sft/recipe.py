"""Recipes: a YAML file of training settings plus command-line overrides, parsed the TRL way.

`parse_recipe` runs TRL's `TrlParser` over (`FilterScriptArguments`, `SFTConfig`,
`FilterModelConfig`): the YAML `--config` file sets the defaults, flags override them (on a
machine without CUDA, `training.sft.launch.process_defaults` comes first). Before
TRL reads the file, every key is checked against the three configs' fields and every value
against the field's type and choices, so a typo or a wrong value fails at start-up with a
`ConfigError` naming the file and the field (TRL alone would accept a wrongly typed value
and fail far into the run, or not at all).
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn

from trl import SFTConfig, TrlParser

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.core.settings import read_yaml_mapping
from sieverag.training.sft.launch import process_defaults
from sieverag.training.sft.sft_config import FilterModelConfig, FilterScriptArguments

CONFIG_FLAG = "--config"
# HfArgumentParser's message for command-line flags no dataclass field takes.
_UNUSED_FLAGS = re.compile(r"not used by the HfArgumentParser: (\[.*\])")
_TYPE_NAMES = {"string_to_bool": "a boolean (true or false)", "int": "an integer",
               "float": "a number"}
_QUANTIZED = "sieverag trains LoRA on a bf16 or float32 base, not on a quantized one (QLoRA)"
# Fields of TRL's configs that sieverag's training does not use: a recipe or flag that moves
# one off its default is refused, naming it and why (TRL would drop it without a word).
UNUSED_FIELDS: dict[str, str] = {
    "model_revision": "the base model is a local folder (nothing is downloaded): check that "
                      "revision out into the folder",
    "load_in_8bit": _QUANTIZED, "load_in_4bit": _QUANTIZED, "bnb_4bit_quant_type": _QUANTIZED,
    "use_bnb_nested_quant": _QUANTIZED, "bnb_4bit_quant_storage": _QUANTIZED,
    "chat_template_path": "the chat template is the base tokenizer's own, else sieverag's "
                          "named fallback, which the filter card records for every consumer "
                          "(inference/llm/chat_template.py)",
    "dataset_text_field": "filter records are prompt/completion conversations, not a text "
                          "column",
    "assistant_only_loss": "the loss falls on the completion (completion_only_loss)",
}


@dataclass
class Recipe:
    """The parsed settings of one training run, and where they came from."""

    script: FilterScriptArguments
    training: SFTConfig
    model: FilterModelConfig
    path: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    """The recipe file's mapping as written (for the adapter's metadata)."""
    overrides: list[str] = field(default_factory=list)
    """The command-line flags given beside `--config`."""


class _ArgumentError(ConfigError):
    """A flag or value argparse rejected (the message already names its source)."""


class _RecipeParser(TrlParser):
    """A `TrlParser` whose argument errors raise `ConfigError` instead of exiting."""

    def __init__(self, source: str) -> None:
        super().__init__((FilterScriptArguments, SFTConfig, FilterModelConfig),
                         prog="sieverag.training.sft")
        self.source = source
        self.set_defaults(**process_defaults())

    def error(self, message: str) -> NoReturn:
        raise _ArgumentError(f"{self.source}: {message}")


def parse_recipe(argv: Sequence[str]) -> Recipe:
    """Parse `[--config RECIPE.yaml] [--field value ...]` into a `Recipe`.

    Raises `ConfigError` for a missing or malformed recipe, an unknown field, a value of the
    wrong type or outside the field's choices, and an invalid combination of values.
    """
    args = list(argv)
    path = _config_path(args)
    source = f"recipe {path}" if path else "training arguments"
    parser = _RecipeParser(source)
    values: dict[str, Any] = {}
    if path is not None:
        values = _read_recipe(Path(path))
        _check_recipe_values(parser, values, f"recipe {path}")
    try:
        script, training, model = parser.parse_args_and_config(args)
    except _ArgumentError:
        raise
    except (ConfigError, ValueError, TypeError) as err:
        unused = _UNUSED_FLAGS.search(str(err))
        if unused:
            raise ConfigError(f"{source}: unknown flag(s) {unused.group(1)}; flags are the "
                              "fields of FilterScriptArguments, trl.SFTConfig and "
                              "FilterModelConfig") from None
        raise ConfigError(f"{source}: {err}") from err
    for config in (script, training, model):
        _check_unused(config, source)
    overrides = [a for a in args if a not in (CONFIG_FLAG, path)]
    return Recipe(script, training, model, path, values, overrides)


def _check_unused(config: Any, source: str) -> None:
    """Refuse a config whose `UNUSED_FIELDS` are set off their defaults."""
    for item in fields(config):
        why = UNUSED_FIELDS.get(item.name)
        if why is None:
            continue
        default = item.default if item.default is not MISSING else (
            item.default_factory() if item.default_factory is not MISSING else None)
        if getattr(config, item.name) != default:
            raise ConfigError(f"{source}: field {item.name} is not used by sieverag's training "
                              f"({why}): remove it")


def _config_path(args: list[str]) -> str | None:
    if CONFIG_FLAG not in args:
        return None
    position = args.index(CONFIG_FLAG)
    if position + 1 >= len(args):
        raise ConfigError(f"{CONFIG_FLAG} needs a recipe file (e.g. "
                          "training/sft/recipes/smollm2_filter_cpu.yaml)")
    return args[position + 1]


def _read_recipe(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"recipe {path} not found: give a YAML file such as "
                          "training/sft/recipes/smollm2_filter_cpu.yaml")
    values = read_yaml_mapping(path)
    if not values:  # TRL refuses a recipe without a mapping; say so before it does
        raise ConfigError(f"recipe {path} is empty: give it field: value lines such as "
                          "training/sft/recipes/smollm2_filter_cpu.yaml")
    return values


def _check_recipe_values(parser: argparse.ArgumentParser, values: dict[str, Any],
                         source: str) -> None:
    """Every key is a known field, every value fits the field's type and choices."""
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    for key, value in values.items():
        if key == "env":  # TRL sets these environment variables before parsing
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: field env must be a mapping of NAME: value")
            continue
        action = actions.get(key)
        if action is None:
            close = difflib.get_close_matches(str(key), list(actions), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{source}: unknown field {key!r}{hint}; fields are those of "
                              "FilterScriptArguments, trl.SFTConfig and FilterModelConfig")
        _check_value(action, key, value, source)


def _check_value(action: argparse.Action, key: str, value: Any, source: str) -> None:
    if value is None or isinstance(value, dict):
        return  # null keeps "unset"; mappings are JSON-valued fields (e.g. model_init_kwargs)
    takes_list = action.nargs in ("+", "*")
    if isinstance(value, list) and not takes_list:
        raise ConfigError(f"{source}: field {key} takes one value, got a list {value!r}")
    for item in value if isinstance(value, list) else [value]:
        text = str(item).lower() if isinstance(item, bool) else str(item)
        converted: Any = text
        if action.type is not None:
            try:
                converted = action.type(text)
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                kind = _TYPE_NAMES.get(getattr(action.type, "__name__", ""), "a valid value")
                raise ConfigError(f"{source}: field {key} must be {kind}, "
                                  f"got {item!r}") from None
        if action.choices is not None and converted not in action.choices:
            choices = ", ".join(str(c) for c in action.choices)
            raise ConfigError(f"{source}: field {key} must be one of {choices}, got {item!r}")
