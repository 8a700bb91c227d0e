"""Checking the fields of one dataset record: each function reads one field (id, question,
answer aliases, gold flags, ...) and raises a `DatasetError` naming the file, the record's
place in it and the field when the value has the wrong shape."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sieverag.inference.data.files import Record, json_type
from sieverag.inference.errors import DatasetError


@dataclass(frozen=True)
class RecordSource:
    """Where a record sits in its file: for error messages and for ids of rows without one."""

    path: Path
    location: str
    fallback_id: str

    def error(self, problem: str) -> DatasetError:
        """A `DatasetError` naming the file and the record's place in it."""
        return DatasetError(f"{self.path}, {self.location}: {problem}")


def record_id(record: Record, source: RecordSource) -> str:
    """The record's `id` as a string; `source.fallback_id` where it has none."""
    value = record.get("id")
    if value is None:
        return source.fallback_id
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise source.error(f"'id' is {json_type(value)}, expected a string or a number")
    return str(value)


def question_text(record: Record, source: RecordSource) -> str:
    """The record's `question`, stripped; a missing or blank one is an error."""
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        if "question" not in record:
            raise source.error("record has no 'question' field")
        raise source.error(f"'question' is {json_type(question)}, expected a non-empty string")
    return question.strip()


def answer_aliases(value: Any, source: RecordSource, field: str) -> tuple[str, ...]:
    """Distinct non-empty answer aliases in order; a bare string or number is one alias."""
    if value is None:
        raise source.error(f"record has no {field!r} field; every example needs an answer")
    aliases = value if isinstance(value, (list, tuple)) else [value]
    answers: dict[str, None] = {}
    for alias in aliases:
        if isinstance(alias, bool) or not isinstance(alias, (str, int, float)):
            raise source.error(f"{field!r} holds {json_type(alias)}, expected strings")
        if text := str(alias).strip():
            answers[text] = None
    if not answers:
        raise source.error(f"example has no answers ({field!r} is empty)")
    return tuple(answers)


def literal_list(value: Any, source: RecordSource, field: str) -> Any:
    """A string holding a Python list literal ("['a', 'b']") as that list; else unchanged."""
    if not isinstance(value, str) or not value.lstrip().startswith("["):
        return value
    try:
        parsed = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError) as err:
        raise source.error(f"{field!r} is not a valid list literal ({err})") from None
    if not isinstance(parsed, (list, tuple)):
        raise source.error(f"{field!r} is not a list literal")
    return parsed


def supporting_facts(value: Any, source: RecordSource) -> dict[str, set[int]] | None:
    """HotpotQA `[title, sentence_index]` pairs grouped by title; None where absent."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise source.error(f"'supporting_facts' is {json_type(value)}, expected an array")
    by_title: dict[str, set[int]] = {}
    for fact in value:
        if (
            not isinstance(fact, (list, tuple))
            or len(fact) != 2
            or not isinstance(fact[0], str)
            or isinstance(fact[1], bool)
            or not isinstance(fact[1], int)
            or fact[1] < 0
        ):
            raise source.error(f"supporting fact {fact!r} is not a [title, sentence_index] pair")
        by_title.setdefault(fact[0], set()).add(fact[1])
    return by_title


def gold_flag(
    item: Record, keys: tuple[str, ...], source: RecordSource, where: str
) -> bool | None:
    """The first of `keys` present (and not null) as a bool; None where none is."""
    for key in keys:
        value = item.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or value in (0, 1):
            return bool(value)
        raise source.error(f"{where}.{key} is {value!r}, expected true or false")
    return None


def list_field(record: Record, field: str, source: RecordSource) -> list[Any]:
    """The array in `record[field]`; [] where the field is absent or null."""
    value = record.get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        raise source.error(f"{field!r} is {json_type(value)}, expected an array")
    return value


def optional_str(item: Record, key: str, source: RecordSource, where: str) -> str:
    """The string in `item[key]`; "" where the key is absent or null."""
    value = item.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise source.error(f"{where}.{key} is {json_type(value)}, expected a string")
    return value


def optional_strings(value: Any, source: RecordSource, where: str) -> tuple[str, ...] | None:
    """`value` as a tuple of strings; None where it is null."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise source.error(f"{where} is not an array of strings")
    return tuple(value)


def example_metadata(name: str, record: Record, keys: tuple[str, ...]) -> dict[str, Any]:
    """The dataset's name plus the record fields worth keeping for reports."""
    return {"dataset": name, **{key: record[key] for key in keys if key in record}}
