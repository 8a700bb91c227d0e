"""One way to configure every command: typed dataclasses, a YAML file, flags.

* `@settings` makes a config class: a frozen pydantic dataclass, validated on construction
  (types, `Literal` choices, nested configs), unknown keys refused; each field's
  `metadata={"help": ...}` is its flag's help.
* `parse_settings(cls, argv, prog)` reads a command's config: the class's defaults, then a
  named preset (`--preset NAME`, shipped YAML), then a YAML file (`--config FILE`, e.g. a run
  folder's config.yaml), then flags (`--limit 5`, nested fields as dotted flags:
  `--amber.collector.max-queries 3`). Later sources override earlier ones key by key.
* `load_settings` / `settings_to_yaml` read and write a config as YAML, strictly.
* `at_least(1, limit=self.limit)` refuses a setting below its minimum, in one wording for
  every config's `__post_init__`.
* `reads_old_keys(OLD_TO_NEW)` lets a config class read the keys it had before a rename
  (a run folder's old config.yaml still loads).

Flags come from pydantic-settings' command-line source, so every command spells them the
same way: kebab-case names, `--flag/--no-flag` for booleans, comma-separated lists.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BeforeValidator, ConfigDict, TypeAdapter, ValidationError, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass
from yaml.reader import ReaderError

from sieverag.inference.core.errors import ConfigError, validation_problems
from sieverag.inference.core.io_utils import read_text

T = TypeVar("T")

PRESETS_DIR = Path(__file__).parents[1] / "presets"


def _one_or_more(value: Any) -> Any:
    """A single file name (a YAML string) is a list of one."""
    return (value,) if isinstance(value, str) else value


# One file or several: a flag's comma list, a YAML list, or a YAML string (a list of one).
FileList = Annotated[tuple[str, ...], BeforeValidator(_one_or_more)]


def settings(cls: type[T]) -> type[T]:
    """Make `cls` a config: frozen, validated on construction, unknown keys refused, each
    field's `metadata["help"]` shown as its flag's help."""
    made = pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid"))(cls)
    for spec in dataclasses.fields(made):
        if "help" in spec.metadata:
            made.__pydantic_fields__[spec.name].description = spec.metadata["help"]
    validating_init = made.__init__

    @functools.wraps(validating_init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            validating_init(self, *args, **kwargs)
        except ValidationError as err:  # built in code: the same error as from a file
            names = [spec.name for spec in dataclasses.fields(made)]
            raise ConfigError(_described(err, made.__name__, names)) from None

    made.__init__ = __init__
    return made


def reads_old_keys(old_to_new: Mapping[str, str]) -> Any:
    """A before-validator for a config class's body (`_read_old_keys = reads_old_keys({...})`):
    a mapping given to the class reads each old key of `old_to_new` as its new one."""

    def read_old_keys(data: Any) -> Any:
        if isinstance(data, Mapping):
            return {old_to_new.get(key, key): value for key, value in data.items()}
        return data

    return model_validator(mode="before")(read_old_keys)


@dataclasses.dataclass(frozen=True)
class Section:
    """A settings class nested under a command's config by `key` (`amber:` in a YAML file,
    `--amber.k` as a flag); a pipeline declares the sections it reads."""

    key: str
    cls: type
    help: str
    # Keys of the command's own config that moved into this section (read there still).
    moved_keys: tuple[str, ...] = ()


def _reads_moved_keys(sections: Sequence[Section]) -> Any:
    """A before-validator reading a config's old top-level keys into the sections they moved to
    (a key given in its section wins)."""
    moved = {key: section.key for section in sections for key in section.moved_keys}

    def read_moved_keys(data: Any) -> Any:
        if not isinstance(data, Mapping) or not moved.keys() & data.keys():
            return data
        data = dict(data)
        for key in moved.keys() & data.keys():
            section = data.get(moved[key])
            section = dict(section) if isinstance(section, Mapping) else {}
            section.setdefault(key, data.pop(key))
            data[moved[key]] = section
        return data

    return model_validator(mode="before")(read_moved_keys)


def with_sections(cls: type[T], sections: Sequence[Section]) -> type[T]:
    """`cls` (not yet a `@settings` class) with one field per section, after its own fields,
    each defaulting to its class's defaults; a mapping given to it reads each section's
    `moved_keys` at the top level into the section."""
    annotations = cls.__dict__.get("__annotations__", {})
    for section in sections:
        if section.key in annotations:
            raise ConfigError(f"{cls.__name__} already has a field {section.key!r}; a section "
                              "cannot take its name")
        annotations[section.key] = section.cls
        setattr(cls, section.key, dataclasses.field(default_factory=section.cls,
                                                    metadata={"help": section.help}))
    cls.__annotations__ = annotations
    if any(section.moved_keys for section in sections):
        cls._read_moved_keys = _reads_moved_keys(sections)
    return cls


def _described(err: ValidationError, where: str, positional: Sequence[str] = ()) -> str:
    return (f"invalid settings in {where}: "
            + validation_problems(err, "unknown setting", "required, not given", positional))


def validate_settings(cls: type[T], data: Any, where: str) -> T:
    """`cls` built from plain data; any invalid or unknown key is one `ConfigError` naming
    the dotted field and `where` the data came from."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping of settings, got {type(data).__name__}")
    try:
        return TypeAdapter(cls).validate_python(data)
    except ValidationError as err:
        raise ConfigError(_described(err, where)) from None


def settings_to_data(config: Any) -> dict:
    """Plain YAML/JSON-ready data of a config (tuples become lists)."""
    return TypeAdapter(type(config)).dump_python(config, mode="json")


def settings_to_yaml(config: Any) -> str:
    return yaml.safe_dump(settings_to_data(config), sort_keys=False, allow_unicode=True)


def read_yaml_mapping(path: str | Path) -> dict:
    """The mapping in YAML file `path` (an empty file is an empty mapping)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    text = read_text(path, ConfigError)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path}{_yaml_problem(err, text)}") from None
    except RecursionError:
        raise ConfigError(f"config file {path} is nested too deeply to read") from None
    except ValueError as err:  # a value its tag cannot hold: a date 2024-13-01, a 5,000-digit int
        raise ConfigError(f"config file {path} holds a value that cannot be read "
                          f"({err})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    return data


def _yaml_problem(err: yaml.YAMLError, text: str) -> str:
    """PyYAML's error as one line, ", line L, column C: not valid YAML (problem)", without
    the excerpt and caret its message draws over several lines."""
    if isinstance(err, ReaderError):  # a character YAML forbids: an offset, not a mark
        line = text.count("\n", 0, err.position)
        column = err.position - (text.rfind("\n", 0, err.position) + 1)
        place: tuple[int, int] | None = (line, column)
        problem = f"unacceptable character #x{err.character:04x}: {err.reason}"
    else:
        mark = getattr(err, "problem_mark", None)
        place = (mark.line, mark.column) if mark else None
        problem = getattr(err, "problem", None) or " ".join(str(err).split())
    where = f", line {place[0] + 1}, column {place[1] + 1}" if place else ""
    return f"{where}: not valid YAML ({problem})"


def load_settings(cls: type[T], path: str | Path) -> T:
    """Read a config YAML strictly (unknown keys and bad values are errors)."""
    return validate_settings(cls, read_yaml_mapping(path), str(path))


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    """The shipped preset `name` (`--preset NAME`)."""
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r} (shipped: {', '.join(preset_names())})")
    return path


def merge_settings(base: dict, override: dict) -> dict:
    """`override` laid over `base`, nested mappings merged key by key."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_settings(merged[key], value)
        else:
            merged[key] = value
    return merged


def parse_settings(cls: type[T], argv: Sequence[str], prog: str) -> T:
    """The config of a command run as `prog ARGV`: defaults < --preset < --config < flags."""
    import argparse

    sources = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    sources.add_argument("--preset")
    sources.add_argument("--config")
    chosen, rest = sources.parse_known_args(list(argv))
    data: dict = {}
    where = ["flags"]
    if chosen.preset:
        data = merge_settings(data, read_yaml_mapping(preset_path(chosen.preset)))
        where.insert(0, f"preset {chosen.preset}")
    if chosen.config:
        data = merge_settings(data, read_yaml_mapping(chosen.config))
        where.insert(-1, str(chosen.config))
    data = merge_settings(data, _parse_flags(cls, rest, prog))
    return validate_settings(cls, data, " + ".join(where))


def _parse_flags(cls: type, argv: list[str], prog: str) -> dict:
    """Only the settings given as flags, nested as the config is (pydantic-settings)."""
    import argparse

    from pydantic_settings import BaseSettings, CliSettingsSource, SettingsConfigDict, SettingsError

    class CommandLine(BaseSettings, cls):  # the flags of `cls`'s fields
        __doc__ = inspect.cleandoc(cls.__doc__ or "")
        model_config = SettingsConfigDict(
            extra="forbid", case_sensitive=True, cli_prog_name=prog, cli_kebab_case=True,
            cli_implicit_flags=True, cli_avoid_json=True, cli_hide_none_type=True,
            cli_enforce_required=False)

    for spec in dataclasses.fields(cls):  # the subclass rebuilt its fields without help
        if "help" in spec.metadata:
            CommandLine.model_fields[spec.name].description = spec.metadata["help"]
    source = CliSettingsSource(CommandLine)
    source.root_parser.usage = f"{prog} [--config FILE] [--preset NAME] [flags]"
    # --preset and --config are read before the flags; listed here for --help only.
    group = source.root_parser.add_argument_group("configuration files")
    group.add_argument("--preset", metavar="NAME", default=argparse.SUPPRESS,
                       help="start from a shipped preset (" + ", ".join(preset_names()) + ")")
    group.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                       help="start from a YAML file of these settings (e.g. a run folder's "
                            "config.yaml); flags override it")
    try:
        return source(args=argv)()
    except SettingsError as err:  # a flag value the command-line source cannot read
        raise ConfigError(f"invalid flags for {prog}: {err}") from None


def at_least(minimum: int, /, section: str = "", **values: float | None) -> None:
    """Refuse a setting below `minimum`: one `ConfigError` "SECTIONNAME must be >= MINIMUM,
    got VALUE" naming the first of `values` that is (None is unset and passes). For a config's
    `__post_init__`: `at_least(1, "amber.", k=self.k, max_iterations=self.max_iterations)`."""
    for name, value in values.items():
        if value is not None and value < minimum:
            raise ConfigError(f"{section}{name} must be >= {minimum}, got {value}")


def narrow(config: Any, cls: type[T]) -> T:
    """The `cls` part of `config`, a command's settings that extend `cls` with fields of
    their own (e.g. where results go)."""
    return cls(**{spec.name: getattr(config, spec.name) for spec in dataclasses.fields(cls)})
