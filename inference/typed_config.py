"""Strict loading of typed dataclass configs from YAML mappings.

Unknown keys are errors (named with their dotted path), values are checked against the
field types (`Literal` choices, int/float/str/bool, lists, optionals, nested dataclasses),
so a typo fails at start-up instead of being silently ignored.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, TypeVar, Union

from sieverag.inference.errors import ConfigError

T = TypeVar("T")


def from_mapping(cls: type[T], data: Any, where: str = "config") -> T:
    """Build dataclass `cls` from `data`, rejecting unknown keys and wrongly typed values."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key(s) in {where}: {', '.join(unknown)} "
                          f"(known: {', '.join(fields)})")
    values = {name: _convert(hints[name], value, f"{where}.{name}")
              for name, value in data.items()}
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from err


def to_mapping(config: Any) -> dict:
    """A plain-data view of a dataclass config (tuples become lists) for YAML output."""
    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value
    return plain(config)


def _convert(kind: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if dataclasses.is_dataclass(kind):
        return from_mapping(kind, value, where)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(option, value, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: invalid value {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where} must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        item = args[0] if args else Any
        converted = [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(converted) if origin is tuple else converted
    if origin is dict or kind is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return value
    if kind is Any:
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in (int, float, str, bool):
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"{where} must be {kind.__name__}, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported config type {kind!r}")
