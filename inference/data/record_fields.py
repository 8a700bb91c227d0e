"""Checking the fields of one dataset record: each function reads one field (id, question,
answer aliases, gold flags, ...) and raises a `DatasetError` naming the dataset, the record's
place in it and the field when the value has the wrong shape."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.core.types import Document, Example
from sieverag.inference.data.files import Record, json_type


@dataclass(frozen=True)
class RecordSource:
    """Where a record sits in its dataset: for error messages and for ids of rows without one."""

    path: Path | str
    """The dataset file, or the name of a dataset that is not one file (`hf:NAME:SPLIT`)."""
    location: str
    fallback_id: str

    def error(self, problem: str) -> DatasetError:
        """A `DatasetError` naming the file and the record's place in it."""
        return DatasetError(f"{self.path}, {self.location}: {problem}")


def record_id(record: Record, source: RecordSource, keys: tuple[str, ...] = ("id",)) -> str:
    """The first of the record's id `keys` present, as a string; `source.fallback_id` where
    it has none."""
    key = next((key for key in keys if record.get(key) is not None), None)
    if key is None:
        return source.fallback_id
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise source.error(f"{key!r} is {json_type(value)}, expected a string or a number")
    return str(value)


def question_text(record: Record, source: RecordSource, field: str = "question") -> str:
    """The record's question (in `field`), stripped; a missing or blank one is an error."""
    question = record.get(field)
    if not isinstance(question, str) or not question.strip():
        if field not in record:
            raise source.error(f"record has no {field!r} field")
        raise source.error(f"{field!r} is {json_type(question)}, expected a non-empty string")
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
    """A string holding a JSON or Python list literal ('["a", "b"]', "['a', 'b']") as that
    list; else unchanged."""
    if not isinstance(value, str) or not value.lstrip().startswith("["):
        return value
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        try:
            parsed = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError) as err:
            raise source.error(f"{field!r} is not a valid list literal ({err})") from None
    if not isinstance(parsed, (list, tuple)):
        raise source.error(f"{field!r} is not a list literal")
    return parsed


def object_rows(value: Any, source: RecordSource, field: str) -> list[Record]:
    """An array of objects, also when stored as columns (`{key: [...], ...}`, as `datasets`
    stores a sequence of objects); [] where the field is absent or null."""
    if value is None:
        return []
    if isinstance(value, dict):
        columns = list(value.values())
        if not all(isinstance(column, list) for column in columns) or (
            len({len(column) for column in columns}) > 1
        ):
            raise source.error(f"{field!r} is an object of unequal or non-array columns")
        return [dict(zip(value, row, strict=True)) for row in zip(*columns, strict=True)]
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise source.error(f"{field!r} is {json_type(value)}, expected an array of objects")
    return value


def title_pairs(value: Any, source: RecordSource, field: str, second: str) -> list[tuple]:
    """HotpotQA-style `(title, second)` pairs, from `[title, x]` pairs (the official releases)
    or from objects `{title, <second>}` (as rows or as the hub's columns)."""
    if isinstance(value, list) and all(isinstance(item, (list, tuple)) for item in value):
        pairs = [tuple(item) for item in value]
    else:
        pairs = [(row.get("title"), row.get(second))
                 for row in object_rows(value, source, field)]
    for pair in pairs:
        if len(pair) != 2 or not isinstance(pair[0], str):
            raise source.error(f"{field!r} holds {list(pair)!r}, expected a [title, {second}] pair")
    return pairs


def supporting_facts(value: Any, source: RecordSource) -> dict[str, set[int]] | None:
    """HotpotQA supporting facts (`[title, sentence_index]` pairs, or the hub's
    `{title: [...], sent_id: [...]}`) grouped by title; None where absent."""
    if value is None:
        return None
    if not isinstance(value, (list, dict)):
        raise source.error(f"'supporting_facts' is {json_type(value)}, expected an array")
    by_title: dict[str, set[int]] = {}
    for fact in title_pairs(value, source, "supporting_facts", "sent_id"):
        title, index = fact
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise source.error(
                f"supporting fact {list(fact)!r} is not a [title, sentence_index] pair")
        by_title.setdefault(title, set()).add(index)
    return by_title


def titled_passage(example_id: str, index: int, title: str, text: str,
                   sentences: tuple[str, ...] | None, is_gold: bool | None,
                   supporting: dict[str, set[int]] | None) -> Document:
    """Passage `index` of a HotpotQA-layout record, id `{example_id}/{index}`. Its key
    sentences are the supporting facts naming its title (sorted; () for a passage without
    any, None where the record has no supporting facts); indices past its sentences are
    dropped, as the original HotpotQA release holds a few such facts."""
    key_sentences = None
    if supporting is not None:
        indices = supporting.get(title, set())
        if sentences is not None:
            indices = {i for i in indices if i < len(sentences)}
        key_sentences = tuple(sorted(indices))
    return Document(id=f"{example_id}/{index}", text=text, title=title, is_gold=is_gold,
                    sentences=sentences, supporting_sentences=key_sentences)


def sentence_text(sentences: tuple[str, ...]) -> str:
    """A passage's text from its sentences: joined as given (HotpotQA's carry their spaces),
    with a space added where neither side of a join has one."""
    text = ""
    for sentence in sentences:
        if text and sentence and not text[-1].isspace() and not sentence[0].isspace():
            text += " "
        text += sentence
    return text


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


def example_metadata(name: str, record: Record, keys: tuple[str, ...],
                     source: RecordSource) -> dict[str, Any]:
    """The dataset's name, the record fields worth keeping for reports, and its evaluation
    annotations where present: `reference` and `kind` strings, `keywords` an array of
    strings (another type is an error naming the record)."""
    metadata = {"dataset": name, **{key: record[key] for key in keys if key in record}}
    for key in ("reference", "kind"):
        if value := optional_str(record, key, source, "the record").strip():
            metadata[key] = value
    if keywords := optional_strings(record.get("keywords"), source, "the record's 'keywords'"):
        metadata["keywords"] = keywords
    return metadata


def question_only_example(name: str, record: Record, source: RecordSource, answers_field: str,
                          metadata_keys: tuple[str, ...] = ()) -> Example:
    """A record that is a question and its answer aliases (in `answers_field`), no documents:
    TriviaQA's and NQ-open's rows."""
    return Example(
        id=record_id(record, source),
        question=question_text(record, source),
        answers=answer_aliases(record.get(answers_field), source, answers_field),
        metadata=example_metadata(name, record, metadata_keys, source),
    )
