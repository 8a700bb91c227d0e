"""What the embedded server does with each request field it is sent, decided in one place.

Every request body (each endpoint's `protocol`) sorts its fields into four kinds:

* honoured — the fields the server implements (a plain model field);
* ignored — fields that change nothing here (`Ignored`, with the reason): accepted and
  dropped, silently;
* honoured at one value only — fields whose other values mean something this server cannot
  do (`OnlyAt`: `n` above 1, `tools`, a `response_format` other than text): their no-op value
  is accepted, any other is refused with a 400 naming the field and saying why;
* anything else — a field the server does not know: accepted, and named in the response's
  `x-sieverag-ignored` header (`unknown_fields`, `ignored_header`), so a client that sends
  a harmless extra field succeeds and can still see that it had no effect.

`field_lists` reads the kinds back from a request model, and `markdown_table` writes them as
the table docs/server-api.md shows (its test checks the page holds each model's table).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticCustomError, core_schema

IGNORED_HEADER = "x-sieverag-ignored"

# The pydantic error type of a value `OnlyAt` refuses.
CANNOT_HONOUR = "cannot_honour"

# The most unknown field names the header lists (a body may hold thousands).
MAX_HEADER_NAMES = 20


@dataclass(frozen=True)
class Ignored:
    """Field metadata: accepted and ignored, for it changes nothing on this server (`why`)."""

    why: str


@dataclass(frozen=True)
class OnlyAt:
    """Field metadata: only the value(s) `accepted` describes are honoured (they change
    nothing); any other is refused (`CANNOT_HONOUR`) because `why`."""

    accepted: str
    why: str
    accepts: Callable[[Any], bool]

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: Any) -> Any:
        if not self.accepts(value):
            raise PydanticCustomError(CANNOT_HONOUR, "{why} (accepted: {accepted})",
                                      {"why": self.why, "accepted": self.accepted})
        return value


def is_empty(value: Any) -> bool:
    """None or an empty list/object: a field sent at its no-op value."""
    return value is None or value == [] or value == {}


@dataclass(frozen=True)
class FieldLists:
    """A request model's fields by kind (names as a client spells them, nested ones dotted),
    in declaration order."""

    honoured: tuple[tuple[str, str], ...]  # (name, what it does)
    ignored: tuple[tuple[str, str], ...]  # (name, why it changes nothing)
    refused: tuple[tuple[str, str, str], ...]  # (name, the value accepted, why others are not)


def field_lists(model: type[BaseModel], prefix: str = "") -> FieldLists:
    """The fields of `model` (and of its nested request models) by kind."""
    honoured: list[tuple[str, str]] = []
    ignored: list[tuple[str, str]] = []
    refused: list[tuple[str, str, str]] = []
    for name, field in model.model_fields.items():
        dotted = prefix + (field.alias or name)
        marks = field.metadata
        ignore = next((m for m in marks if isinstance(m, Ignored)), None)
        only = next((m for m in marks if isinstance(m, OnlyAt)), None)
        if ignore is not None:
            ignored.append((dotted, ignore.why))
        elif only is not None:
            refused.append((dotted, only.accepted, only.why))
        else:
            honoured.append((dotted, field.description or ""))
        nested = _nested_model(field.annotation)
        if nested is not None:
            inner = field_lists(nested, dotted + ".")
            honoured.extend(inner.honoured)
            ignored.extend(inner.ignored)
            refused.extend(inner.refused)
    return FieldLists(tuple(honoured), tuple(ignored), tuple(refused))


def markdown_table(model: type[BaseModel]) -> str:
    """The fields of `model` as a Markdown table: honoured, then ignored, then refused."""
    lists = field_lists(model)
    rows = [f"| `{name}` | honoured | {what} |" for name, what in lists.honoured]
    rows += [f"| `{name}` | accepted and ignored | {why} |" for name, why in lists.ignored]
    rows += [f"| `{name}` | refused unless {accepted} | {why} |"
             for name, accepted, why in lists.refused]
    return "\n".join(["| field | kind | note |", "|---|---|---|", *rows])


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The request model inside a field's type (`X`, `X | None`, `list[X]`, `str | list[X]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in getattr(annotation, "__args__", ()):
        found = _nested_model(argument)
        if found is not None:
            return found
    return None


def unknown_fields(body: BaseModel, prefix: str = "") -> list[str]:
    """The fields of `body` (and of the request models inside it) that no model declares,
    each once, in the order met; nested ones as `messages[].refusal`."""
    names: dict[str, None] = {}
    for name in body.model_extra or {}:
        names[prefix + name] = None
    for name, field in type(body).model_fields.items():
        value = getattr(body, name)
        label = prefix + (field.alias or name)
        if isinstance(value, BaseModel):
            names.update(dict.fromkeys(unknown_fields(value, label + ".")))
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, BaseModel):
                    names.update(dict.fromkeys(unknown_fields(item, label + "[].")))
    return list(names)


def ignored_header(names: list[str]) -> dict[str, str]:
    """The `x-sieverag-ignored` header naming `names` (none: no header). Names are sent as
    JSON spells them in ASCII (a client's key may hold any character, a header may not),
    at most MAX_HEADER_NAMES of them, then how many more there were."""
    if not names:
        return {}
    shown = [json.dumps(name)[1:-1] for name in names[:MAX_HEADER_NAMES]]
    if len(names) > MAX_HEADER_NAMES:
        shown.append(f"... ({len(names) - MAX_HEADER_NAMES} more)")
    return {IGNORED_HEADER: ", ".join(shown)}
