"""Load QA benchmarks as `Example`s: the shared benchmark files and the common ctxs jsonl.

Each format has a reader registered under its name in `DATASET_FORMATS`. `load_examples`
takes a format by name, or detects it from the file name and, failing that, from the keys of
the first record. Readers stream, so `limit` stops reading early. Every problem with a file
ends in one `DatasetError` that names the file and the line (or JSON path) at fault.

Formats (see ../shared/data/README.md for the files themselves):

- `hotpotqa`: `{id, question, answers, passages[{title, text, sentences?, is_gold}],
  supporting_facts}`; supporting facts become each passage's `supporting_sentences`.
- `nq`: NQ-open with its oracle passage, `{question, answers, ctxs[{title, text, hasanswer,
  isgold}], nq_annotated_gold}`, usually gzip-compressed.
- `popqa`: PopQA long-tail with two CRAG knowledge texts per question as its documents.
- `squad`: the official nested SQuAD v1.1 JSON, zipped or not; one example per question whose
  single document is its gold paragraph.
- `common`: `{id?, question, answers | golden_answers, ctxs[{title, text, is_gold? | isgold? |
  hasanswer?}]}` as written by Self-RAG and FlashRAG.
- `triviaqa`: `{id, question, answers}`, no documents.
- `arc`: ARC-Challenge, `{id, question, choices{text, label}, answerKey}`.

Documents get ids stable across runs: `f"{example_id}/{position}"` (`squad-p{n}` for SQuAD
paragraphs); rows without an id get `f"{format}-{line_number}"`.
"""

from __future__ import annotations

import ast
import gzip
import json
import re
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import IO, Any

from sieverag.inference.errors import DatasetError
from sieverag.inference.types import Document, Example

Record = dict[str, Any]

_GZIP_MAGIC = b"\x1f\x8b"
_JSON_TYPE_NAMES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


@dataclass(frozen=True)
class RecordSource:
    """Where a record sits in its file: for error messages and for ids of rows without one."""

    path: Path
    location: str
    fallback_id: str

    def error(self, problem: str) -> DatasetError:
        """A `DatasetError` naming the file and the record's place in it."""
        return DatasetError(f"{self.path}, {self.location}: {problem}")


ExampleReader = Callable[[Path, bool], Iterator[Example]]
"""Reads a file (path, require_documents) into examples, lazily and in file order."""

RecordParser = Callable[[Record, RecordSource], Example]
"""Turns one JSON record of a jsonl file into an example."""


@dataclass(frozen=True)
class DatasetFormat:
    """A registered dataset format: its reader and how to recognise its files."""

    name: str
    read: ExampleReader
    name_hints: frozenset[str]
    """Words of a file name (split on non-alphanumerics) that mark the format."""
    record_signatures: tuple[frozenset[str], ...]
    """Key sets of a first record that mark the format; the largest matching set wins."""


DATASET_FORMATS: dict[str, DatasetFormat] = {}
"""Every known format by name, filled by `register_format` / `register_jsonl_format`."""


def register_format(
    name: str,
    *,
    name_hints: Iterable[str] = (),
    record_signatures: Iterable[Iterable[str]] = (),
) -> Callable[[ExampleReader], ExampleReader]:
    """Register a whole-file reader under `name` (a decorator); returns the reader unchanged."""

    def decorator(read: ExampleReader) -> ExampleReader:
        if name in DATASET_FORMATS:
            raise ValueError(f"dataset format {name!r} is registered twice")
        DATASET_FORMATS[name] = DatasetFormat(
            name=name,
            read=read,
            name_hints=frozenset(name_hints),
            record_signatures=tuple(frozenset(keys) for keys in record_signatures),
        )
        return read

    return decorator


def register_jsonl_format(
    name: str,
    *,
    documents_from: str | None,
    name_hints: Iterable[str] = (),
    record_signatures: Iterable[Iterable[str]] = (),
) -> Callable[[RecordParser], RecordParser]:
    """Register a one-record-per-line format by its record parser (a decorator).

    `documents_from` names the field(s) documents come from, or None when the format has no
    documents; a format with documents rejects a record without any unless the caller passes
    `require_documents=False`.
    """

    def decorator(parse: RecordParser) -> RecordParser:
        def read(path: Path, require_documents: bool) -> Iterator[Example]:
            for line_number, record in iter_jsonl(path):
                source = RecordSource(path, f"line {line_number}", f"{name}-{line_number}")
                example = parse(record, source)
                if documents_from and require_documents and not example.documents:
                    raise source.error(
                        f"record has no documents (expected in {documents_from}); pass "
                        "require_documents=False to load the questions without documents"
                    )
                yield example

        register_format(name, name_hints=name_hints, record_signatures=record_signatures)(read)
        return parse

    return decorator


def load_examples(
    path: str | Path,
    fmt: str = "auto",
    limit: int | None = None,
    *,
    require_documents: bool = True,
) -> list[Example]:
    """Read the examples of a dataset file, in file order.

    `fmt` is a name from `DATASET_FORMATS` or "auto" (see `detect_format`); `limit` keeps the
    first N examples and stops reading there. Raises `DatasetError` for a missing or
    unreadable file, a malformed line, a record without a question or answers, an unknown
    format, a file with no examples, and (unless `require_documents=False`) a record without
    documents in a format that has them.
    """
    path = Path(path)
    if fmt != "auto" and fmt not in DATASET_FORMATS:
        raise DatasetError(
            f"unknown dataset format {fmt!r} for {path}; known formats: "
            f"{', '.join(sorted(DATASET_FORMATS))} (or 'auto')"
        )
    if limit is not None and limit < 0:
        raise DatasetError(f"limit must be 0 or more, got {limit} (for {path})")
    _check_readable(path)
    name = detect_format(path) if fmt == "auto" else fmt
    examples = list(islice(DATASET_FORMATS[name].read(path, require_documents), limit))
    if not examples and limit != 0:
        raise DatasetError(f"{path}: holds no examples (read as format {name!r})")
    return examples


def detect_format(path: str | Path) -> str:
    """Name the format of a dataset file.

    The file name decides when exactly one format claims one of its words (`hotpotqa`, `nq`,
    `popqa`, `squad`, `triviaqa`, `arc`), unless the first record's keys fit another format
    and none of the named one's. Otherwise the keys of the first record decide: the format
    with the largest key signature contained in them. Raises `DatasetError` when nothing
    (or more than one format equally) fits.
    """
    path = Path(path)
    _check_readable(path)
    words = set(re.split(r"[^a-z0-9]+", path.name.lower()))
    named = [f.name for f in DATASET_FORMATS.values() if f.name_hints & words]
    keys = _first_record_keys(path)
    by_keys = _formats_matching_keys(keys)
    if len(named) == 1 and (named[0] in by_keys or not by_keys):
        return named[0]
    if by_keys:
        best = max(by_keys.values())
        winners = sorted(name for name, size in by_keys.items() if size == best)
        if len(winners) == 1:
            return winners[0]
        raise DatasetError(
            f"{path}: the first record fits several formats ({', '.join(winners)}); "
            "pass the format name explicitly"
        )
    raise DatasetError(
        f"{path}: cannot tell the dataset format from the file name or from the first "
        f"record's keys ({', '.join(sorted(keys)) or 'none'}); pass one of "
        f"{', '.join(sorted(DATASET_FORMATS))} explicitly"
    )


def load_squad_paragraphs(path: str | Path) -> list[Document]:
    """The paragraphs of an official SQuAD file as a retrieval corpus, ids `squad-p{n}`.

    `n` counts paragraphs from 0 in file order; titles are the article titles with
    underscores as spaces; `is_gold` is None (gold-ness belongs to a question).
    """
    return [paragraph for paragraph, _ in _iter_squad(Path(path))]


def load_squad_corpus(path: str | Path) -> tuple[list[Document], list[Example]]:
    """The SQuAD paragraphs (as `load_squad_paragraphs`) and every question as an Example.

    Each example's single document is its paragraph marked gold, and
    `metadata["gold_doc_id"]` names that paragraph's id in the corpus.
    """
    paragraphs: list[Document] = []
    examples: list[Example] = []
    for paragraph, questions in _iter_squad(Path(path)):
        paragraphs.append(paragraph)
        examples.extend(questions)
    return paragraphs, examples


# ---- formats ---------------------------------------------------------------------------


@register_jsonl_format(
    "hotpotqa",
    documents_from="'passages'",
    name_hints=("hotpotqa", "hotpot"),
    record_signatures=(("question", "answers", "passages"),),
)
def _parse_hotpotqa(record: Record, source: RecordSource) -> Example:
    """HotpotQA distractor: 10 passages, gold marked, supporting facts on some rows.

    Where the row has `supporting_facts`, every passage gets `supporting_sentences` (empty for
    passages without any); indices past a passage's sentence list are dropped, as the
    original HotpotQA release holds a few such facts.
    """
    example_id = _example_id(record, source)
    supporting = _supporting_facts(record.get("supporting_facts"), source)
    documents = []
    for index, passage in enumerate(_list_field(record, "passages", source)):
        where = f"passages[{index}]"
        if not isinstance(passage, dict):
            raise source.error(f"{where} is {_json_type(passage)}, expected an object")
        sentences = _optional_strings(passage.get("sentences"), source, f"{where}.sentences")
        text = passage.get("text")
        if text is None and sentences is not None:
            text = "".join(sentences)
        if not isinstance(text, str):
            raise source.error(f"{where} has no 'text' string")
        title = _optional_str(passage, "title", source, where)
        key_sentences = None
        if supporting is not None:
            indices = supporting.get(title, set())
            if sentences is not None:
                indices = {i for i in indices if i < len(sentences)}
            key_sentences = tuple(sorted(indices))
        documents.append(
            Document(
                id=f"{example_id}/{index}",
                text=text,
                title=title,
                is_gold=_gold_flag(passage, ("is_gold",), source, where),
                sentences=sentences,
                supporting_sentences=key_sentences,
            )
        )
    return Example(
        id=example_id,
        question=_question(record, source),
        answers=_answers(record.get("answers"), source, "answers"),
        documents=tuple(documents),
        metadata=_metadata("hotpotqa", record, ("type", "level")),
    )


@register_jsonl_format(
    "nq",
    documents_from="'ctxs'",
    name_hints=("nq",),
    record_signatures=(("question", "answers", "ctxs", "nq_annotated_gold"),),
)
def _parse_nq(record: Record, source: RecordSource) -> Example:
    """NQ-open oracle: `isgold` marks the gold passage, `hasanswer` stands in where absent."""
    return _parse_ctxs_record("nq", record, source)


@register_jsonl_format(
    "common",
    documents_from="'ctxs'",
    record_signatures=(
        ("question", "answers", "ctxs"),
        ("question", "golden_answers", "ctxs"),
        ("question", "golden_answers"),
    ),
)
def _parse_common(record: Record, source: RecordSource) -> Example:
    """Self-RAG / FlashRAG jsonl; `golden_answers` is read where `answers` is absent."""
    return _parse_ctxs_record("common", record, source)


_POPQA_KNOWLEDGE_FIELDS = ("crag_refined_retrieved_knowledge", "crag_web_search_knowledge")


@register_jsonl_format(
    "popqa",
    documents_from=" or ".join(f"'{field}'" for field in _POPQA_KNOWLEDGE_FIELDS),
    name_hints=("popqa",),
    record_signatures=(("question", "answers", "s_wiki_title"),),
)
def _parse_popqa(record: Record, source: RecordSource) -> Example:
    """PopQA: documents are the non-empty CRAG knowledge texts, titled by `s_wiki_title`.

    A document's id keeps its field's position (`/0` refined retrieval, `/1` web search) even
    when the other is empty. `answers` may be a JSON list or a string holding a Python list
    literal; a string not starting with "[" is one answer. `possible_answers` (the original
    PopQA field) is read where `answers` is absent.
    """
    example_id = _example_id(record, source)
    title = _optional_str(record, "s_wiki_title", source, "record")
    documents = []
    for index, field in enumerate(_POPQA_KNOWLEDGE_FIELDS):
        text = _optional_str(record, field, source, "record").strip()
        if text:
            documents.append(Document(id=f"{example_id}/{index}", text=text, title=title))
    field = "answers" if "answers" in record else "possible_answers"
    return Example(
        id=example_id,
        question=_question(record, source),
        answers=_answers(_literal_list(record.get(field), source, field), source, field),
        documents=tuple(documents),
        metadata=_metadata("popqa", record, ("prop", "pop", "s_wiki_title", "question_id")),
    )


@register_jsonl_format(
    "triviaqa",
    documents_from=None,
    name_hints=("triviaqa", "tqa"),
    record_signatures=(("question", "answers"),),
)
def _parse_triviaqa(record: Record, source: RecordSource) -> Example:
    """TriviaQA questions with their answer aliases, no documents."""
    return Example(
        id=_example_id(record, source),
        question=_question(record, source),
        answers=_answers(record.get("answers"), source, "answers"),
        metadata=_metadata("triviaqa", record, ("question_id",)),
    )


@register_jsonl_format(
    "arc",
    documents_from=None,
    name_hints=("arc",),
    record_signatures=(("question", "choices", "answerKey"),),
)
def _parse_arc(record: Record, source: RecordSource) -> Example:
    """ARC multiple choice: `choices` label → text, answers = (correct text, its label).

    Score ARC with `metrics.choice_accuracy`; the answers are there for the answer metrics,
    where the one-letter label alias would match any prediction holding that letter as a word.
    """
    choices = record.get("choices")
    if not isinstance(choices, dict):
        raise source.error("record has no 'choices' object ({text: [...], label: [...]})")
    texts = _optional_strings(choices.get("text"), source, "choices.text") or ()
    labels = _optional_strings(choices.get("label"), source, "choices.label") or ()
    if not labels or len(labels) != len(texts):
        raise source.error(
            f"'choices' needs as many labels as texts, got {len(labels)} and {len(texts)}"
        )
    options = dict(zip(labels, texts, strict=True))
    key = record.get("answerKey")
    if key not in options:
        raise source.error(f"answerKey {key!r} is not one of the labels {', '.join(labels)}")
    return Example(
        id=_example_id(record, source),
        question=_question(record, source),
        answers=_answers([options[key], key], source, "answerKey"),
        choices=options,
        answer_key=key,
        metadata=_metadata("arc", record, ()),
    )


@register_format("squad", name_hints=("squad",), record_signatures=(("data",),))
def _read_squad(path: Path, require_documents: bool) -> Iterator[Example]:
    """Official SQuAD JSON (zipped or plain): one example per question, paragraph as gold."""
    for _, questions in _iter_squad(path):
        yield from questions


# ---- shared record parsing -------------------------------------------------------------


def _parse_ctxs_record(name: str, record: Record, source: RecordSource) -> Example:
    """A `{question, answers, ctxs}` record; gold from is_gold, else isgold, else hasanswer."""
    example_id = _example_id(record, source)
    documents = []
    for index, ctx in enumerate(_list_field(record, "ctxs", source)):
        where = f"ctxs[{index}]"
        if not isinstance(ctx, dict):
            raise source.error(f"{where} is {_json_type(ctx)}, expected an object")
        text = ctx.get("text")
        if not isinstance(text, str):
            raise source.error(f"{where} has no 'text' string")
        documents.append(
            Document(
                id=f"{example_id}/{index}",
                text=text,
                title=_optional_str(ctx, "title", source, where),
                is_gold=_gold_flag(ctx, ("is_gold", "isgold", "hasanswer"), source, where),
            )
        )
    field = "answers" if "answers" in record else "golden_answers"
    return Example(
        id=example_id,
        question=_question(record, source),
        answers=_answers(record.get(field), source, field),
        documents=tuple(documents),
        metadata=_metadata(name, record, ()),
    )


def _example_id(record: Record, source: RecordSource) -> str:
    value = record.get("id")
    if value is None:
        return source.fallback_id
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise source.error(f"'id' is {_json_type(value)}, expected a string or a number")
    return str(value)


def _question(record: Record, source: RecordSource) -> str:
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        if "question" not in record:
            raise source.error("record has no 'question' field")
        raise source.error(f"'question' is {_json_type(question)}, expected a non-empty string")
    return question.strip()


def _answers(value: Any, source: RecordSource, field: str) -> tuple[str, ...]:
    """Distinct non-empty answer aliases in order; a bare string or number is one alias."""
    if value is None:
        raise source.error(f"record has no {field!r} field; every example needs an answer")
    aliases = value if isinstance(value, (list, tuple)) else [value]
    answers: dict[str, None] = {}
    for alias in aliases:
        if isinstance(alias, bool) or not isinstance(alias, (str, int, float)):
            raise source.error(f"{field!r} holds {_json_type(alias)}, expected strings")
        if text := str(alias).strip():
            answers[text] = None
    if not answers:
        raise source.error(f"example has no answers ({field!r} is empty)")
    return tuple(answers)


def _literal_list(value: Any, source: RecordSource, field: str) -> Any:
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


def _supporting_facts(value: Any, source: RecordSource) -> dict[str, set[int]] | None:
    """HotpotQA `[title, sentence_index]` pairs grouped by title; None where absent."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise source.error(f"'supporting_facts' is {_json_type(value)}, expected an array")
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


def _gold_flag(
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


def _list_field(record: Record, field: str, source: RecordSource) -> list[Any]:
    value = record.get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        raise source.error(f"{field!r} is {_json_type(value)}, expected an array")
    return value


def _optional_str(item: Record, key: str, source: RecordSource, where: str) -> str:
    value = item.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise source.error(f"{where}.{key} is {_json_type(value)}, expected a string")
    return value


def _optional_strings(value: Any, source: RecordSource, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise source.error(f"{where} is not an array of strings")
    return tuple(value)


def _metadata(name: str, record: Record, keys: tuple[str, ...]) -> dict[str, Any]:
    """The dataset's name plus the record fields worth keeping for reports."""
    return {"dataset": name, **{key: record[key] for key in keys if key in record}}


def _json_type(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


# ---- files -----------------------------------------------------------------------------


def _check_readable(path: Path) -> None:
    if not path.exists():
        raise DatasetError(f"{path}: no such dataset file; check the path")
    if not path.is_file():
        raise DatasetError(f"{path}: is not a file; pass the path of a dataset file")


def _open_text(path: Path) -> IO[str]:
    """Open a text file for reading, decompressing it when it is gzip (by content)."""
    with path.open("rb") as handle:
        compressed = handle.read(2) == _GZIP_MAGIC
    if compressed:
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return path.open(encoding="utf-8-sig")


def iter_jsonl(path: Path) -> Iterator[tuple[int, Record]]:
    """(1-based line number, record) for each non-blank line of a jsonl file."""
    _check_readable(path)
    line_number = 0
    try:
        with _open_text(path) as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DatasetError(
                        f"{path}, line {line_number}: not valid JSON ({err.msg} at column "
                        f"{err.colno}); fix or remove the line"
                    ) from None
                if not isinstance(record, dict):
                    raise DatasetError(
                        f"{path}, line {line_number}: is {_json_type(record)}, "
                        "expected a JSON object"
                    )
                yield line_number, record
    except UnicodeDecodeError:
        raise DatasetError(
            f"{path}, line {line_number + 1}: is not UTF-8 text; re-encode the file as UTF-8"
        ) from None
    except (OSError, EOFError) as err:
        raise DatasetError(f"{path}: cannot be read ({err})") from None


def _first_record_keys(path: Path) -> set[str]:
    """The keys of a file's first record (for a zip, of the JSON document inside)."""
    if zipfile.is_zipfile(path):
        document = _load_json_document(path)
        return set(document) if isinstance(document, dict) else set()
    try:
        for _, record in iter_jsonl(path):
            return set(record)
    except DatasetError as line_error:
        # Not jsonl; it may be one JSON document over many lines (a plain SQuAD file).
        try:
            document = _load_json_document(path)
        except DatasetError:
            raise line_error from None
        if isinstance(document, dict):
            return set(document)
        raise
    raise DatasetError(f"{path}: holds no records (the file is empty)")


def _formats_matching_keys(keys: set[str]) -> dict[str, int]:
    """Each format with a signature inside `keys`, with the size of its largest such one."""
    sizes = {
        spec.name: max((len(sig) for sig in spec.record_signatures if sig <= keys), default=0)
        for spec in DATASET_FORMATS.values()
    }
    return {name: size for name, size in sizes.items() if size}


def _load_json_document(path: Path) -> Any:
    """A whole-file JSON document, from the first `.json` member when the file is a zip."""
    where = str(path)
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                members = [n for n in archive.namelist() if n.lower().endswith(".json")]
                if not members:
                    raise DatasetError(f"{path}: the zip archive holds no .json file")
                where = f"{path} ({members[0]})"
                raw = archive.read(members[0])
        else:
            raw = path.read_bytes()
        return json.loads(raw)
    except json.JSONDecodeError as err:
        raise DatasetError(
            f"{where}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})"
        ) from None
    except UnicodeDecodeError:
        raise DatasetError(f"{where}: is not UTF-8 text; re-encode the file as UTF-8") from None
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        raise DatasetError(f"{where}: cannot be read ({err})") from None


def _iter_squad(path: Path) -> Iterator[tuple[Document, list[Example]]]:
    """Each SQuAD paragraph (is_gold None) with its questions as examples."""
    _check_readable(path)
    document = _load_json_document(path)
    articles = document.get("data") if isinstance(document, dict) else None
    if not isinstance(articles, list):
        raise DatasetError(
            f"{path}: not the official SQuAD layout (expected {{'data': [{{'title', "
            "'paragraphs': [{'context', 'qas'}]}]}); pass the official dev/train file"
        )
    paragraph_count = 0
    question_count = 0
    for a, article in enumerate(articles):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise DatasetError(f"{path}, data[{a}]: has no 'paragraphs' array")
        title = str(article.get("title") or "").replace("_", " ")
        paragraphs = article["paragraphs"]
        for p, paragraph in enumerate(paragraphs):
            where = f"data[{a}].paragraphs[{p}]"
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            if not isinstance(context, str):
                raise DatasetError(f"{path}, {where}: has no 'context' string")
            corpus_doc = Document(id=f"squad-p{paragraph_count}", text=context, title=title)
            gold_doc = replace(corpus_doc, is_gold=True)
            paragraph_count += 1
            questions = []
            for q, qa in enumerate(paragraph.get("qas") or []):
                source = RecordSource(path, f"{where}.qas[{q}]", f"squad-q{question_count}")
                question_count += 1
                if not isinstance(qa, dict):
                    raise source.error(f"is {_json_type(qa)}, expected an object")
                texts = [
                    answer.get("text") if isinstance(answer, dict) else answer
                    for answer in qa.get("answers") or []
                ]
                questions.append(
                    Example(
                        id=_example_id(qa, source),
                        question=_question(qa, source),
                        answers=_answers(texts, source, "answers"),
                        documents=(gold_doc,),
                        metadata={"dataset": "squad", "gold_doc_id": corpus_doc.id},
                    )
                )
            yield corpus_doc, questions
