"""Corpus readers: turn a corpus file into source `Document`s (before chunking).

Formats (chosen by name, or detected from the file with `auto`):

* `jsonl` — one `{"id", "title"?, "text"}` object per line (`.gz` allowed), or Pyserini's
  and FlashRAG's `{"id", "contents"}` (the first line of `contents` is the title, the rest the
  text); `id` defaults to the line number;
* `nutrition` — the shared textbook pages, `{"page_number", "text"}` per line (id `page-N`);
* `squad` — the official SQuAD v1.1 JSON (or a `.zip` holding it): one document per paragraph
  (read by `inference.data`, ids `squad-p<n>`);
* `hotpotqa` — the shared HotpotQA jsonl: its passages, deduplicated by title (first text kept);
* `dpr` — DPR's `psgs_w100.tsv`: a header line `id<TAB>text<TAB>title`, then one passage a
  line (the Wikipedia passages the papers retrieve from).

Readers stream (`iter_corpus` yields one document at a time), so an index build never holds
a whole corpus; `scan_corpora` checks a corpus in one pass with memory of 8 bytes a document
(a hash of each id). Every reader fails with a `DatasetError` naming the file (and line)
on a missing file, bad JSON, a record without text, a duplicate id, or an empty corpus.
`load_corpora` reads several files (each in its own detected format) into one corpus,
e.g. HotpotQA's passages with SQuAD's paragraphs and the textbook's pages as further noise;
an id two files share is an error naming both.
"""

from __future__ import annotations

import csv
import hashlib
import sys
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.core.types import Document, Example
from sieverag.inference.data import iter_jsonl, load_squad_corpus

CorpusFormat = Literal["auto", "jsonl", "nutrition", "squad", "hotpotqa", "dpr"]
CORPUS_FORMATS: tuple[str, ...] = get_args(CorpusFormat)


def _require_file(path: Path) -> None:
    if not path.is_file():
        raise DatasetError(f"corpus file not found: {path}")


def _text_of(record: dict[str, Any], where: str) -> str:
    text = record.get("text")
    if not isinstance(text, str) or not text.strip():
        raise DatasetError(f"{where}: record has no text (every corpus record needs a non-empty "
                           "'text' string, or a 'contents' string of title and text)")
    return text


def _checked(documents: list[Document], path: Path) -> list[Document]:
    if not documents:
        raise DatasetError(f"corpus {path} is empty: it holds no documents")
    seen: set[str] = set()
    for document in documents:
        if document.id in seen:
            raise DatasetError(f"corpus {path}: duplicate document id {document.id!r}")
        seen.add(document.id)
    return documents


def iter_jsonl_corpus(path: Path) -> Iterator[Document]:
    """Read `{"id", "title"?, "text"}` or `{"id", "contents"}` lines (see `_title_and_text`);
    a missing id becomes the line number."""
    for line_number, record in iter_jsonl(path):
        title, text = _title_and_text(record, f"{path}:{line_number}")
        doc_id = record.get("id", line_number)
        yield Document(id=str(doc_id), text=text, title=title)


def read_jsonl_corpus(path: Path) -> list[Document]:
    """`iter_jsonl_corpus` as a checked list."""
    return _checked(list(iter_jsonl_corpus(path)), path)


def _title_and_text(record: dict[str, Any], where: str) -> tuple[str, str]:
    """A corpus record's title and text: `{title?, text}`, or Pyserini's / FlashRAG's
    `{contents}` without `text`, whose first line is the title (its surrounding quotes
    stripped, as FlashRAG does) and the rest the text; a one-line `contents` is all text."""
    contents = record.get("contents")
    if "text" in record or not isinstance(contents, str):
        return str(record.get("title") or ""), _text_of(record, where)
    title, newline, text = contents.partition("\n")
    if not newline or not text.strip():
        title, text = "", contents
    return title.strip().strip('"'), _text_of({"text": text}, where)


def iter_nutrition_pages(path: Path) -> Iterator[Document]:
    """Read the textbook's `{"page_number", "text"}` lines as documents `page-N`."""
    for line_number, record in iter_jsonl(path):
        if "page_number" not in record:
            raise DatasetError(f"{path}:{line_number}: record has no 'page_number' "
                               "(is this the nutrition pages file?)")
        text = _text_of(record, f"{path}:{line_number}")
        yield Document(id=f"page-{record['page_number']}", text=text)


def read_nutrition_pages(path: Path) -> list[Document]:
    """`iter_nutrition_pages` as a checked list."""
    return _checked(list(iter_nutrition_pages(path)), path)


DPR_HEADER = ["id", "text", "title"]


def iter_dpr_passages(path: Path) -> Iterator[Document]:
    """Read DPR's `psgs_w100.tsv` (`id<TAB>text<TAB>title` after a header line, fields
    quoted as DPR's own reader expects) one passage at a time."""
    _require_file(path)
    csv.field_size_limit(sys.maxsize)
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            rows = csv.reader(handle, delimiter="\t")
            header = next(rows, None)
            if header != DPR_HEADER:
                raise DatasetError(f"{path}: the first line is {header!r}, a DPR passages "
                                   f"file starts with the header {'<TAB>'.join(DPR_HEADER)}")
            for row in rows:
                where = f"{path}:{rows.line_num}"
                if len(row) != 3:
                    raise DatasetError(f"{where}: {len(row)} fields, a DPR passage line has 3 "
                                       "(id, text, title, tab-separated)")
                yield Document(id=row[0], text=_text_of({"text": row[1]}, where), title=row[2])
    except UnicodeDecodeError:
        raise DatasetError(f"{path}: is not UTF-8 text; re-encode the file as UTF-8") from None


def load_squad(path: Path | str) -> tuple[list[Document], list[Example]]:
    """SQuAD v1.1 as a retrieval benchmark: paragraphs (ids `squad-p<n>`) and questions.

    Read by `inference.data.load_squad_corpus`, so ids match the evaluation's;
    each question's `metadata["gold_doc_id"]` names its paragraph.
    """
    path = Path(path)
    documents, examples = load_squad_corpus(path)
    for document in documents:
        if not document.text.strip():
            raise DatasetError(f"{path}: paragraph {document.id} has no text")
    return _checked(documents, path), examples


def read_squad_paragraphs(path: Path) -> list[Document]:
    """The SQuAD paragraphs only (see `load_squad`)."""
    return load_squad(path)[0]


def read_hotpotqa_passages(path: Path) -> list[Document]:
    """All passages of the HotpotQA jsonl, one per title (the first text seen wins)."""
    by_title: dict[str, Document] = {}
    for line_number, record in iter_jsonl(path):
        passages = record.get("passages")
        if not isinstance(passages, list):
            raise DatasetError(f"{path}:{line_number}: record has no 'passages' list "
                               "(is this the HotpotQA file?)")
        for passage in passages:
            title = str(passage.get("title", ""))
            if title in by_title:
                continue
            text = _text_of(passage, f"{path}:{line_number}: passage {title!r}")
            sentences = passage.get("sentences")
            by_title[title] = Document(
                id=f"hotpotqa:{title}", text=text, title=title,
                sentences=tuple(sentences) if isinstance(sentences, list) else None,
            )
    return _checked(list(by_title.values()), path)


CORPUS_READERS: dict[str, Callable[[Path], Iterator[Document] | list[Document]]] = {
    "jsonl": iter_jsonl_corpus,
    "nutrition": iter_nutrition_pages,
    "squad": read_squad_paragraphs,
    "hotpotqa": read_hotpotqa_passages,
    "dpr": iter_dpr_passages,
}


def detect_corpus_format(path: Path) -> str:
    """Guess the format from the file: `.zip`/`.json` is SQuAD, else the first jsonl record."""
    _require_file(path)
    if path.suffix in {".zip", ".json"}:
        return "squad"
    if path.suffix == ".tsv":
        return "dpr"
    for _, record in iter_jsonl(path):
        if "page_number" in record:
            return "nutrition"
        if "passages" in record:
            return "hotpotqa"
        return "jsonl"
    raise DatasetError(f"corpus {path} is empty: it holds no documents")


def load_corpus(path: Path | str, corpus_format: CorpusFormat = "auto") -> list[Document]:
    """Read a corpus file into source documents (ids unique, every text non-empty)."""
    return _checked(list(iter_corpus(path, corpus_format)), Path(path))


def iter_corpus(path: Path | str, corpus_format: CorpusFormat = "auto") -> Iterator[Document]:
    """A corpus file's documents, one at a time (ids are checked by `scan_corpora`)."""
    path = Path(path)
    if corpus_format not in CORPUS_FORMATS:
        raise DatasetError(f"unknown corpus format {corpus_format!r} for {path}; "
                           f"choose one of {', '.join(CORPUS_FORMATS)}")
    yield from CORPUS_READERS[concrete_format(path, corpus_format)](path)


def concrete_format(path: Path, corpus_format: CorpusFormat) -> str:
    """`corpus_format`, or the format detected from the file when it is `auto`."""
    return detect_corpus_format(path) if corpus_format == "auto" else corpus_format


def _id_hash(document_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(document_id.encode(), digest_size=8).digest(),
                          "little", signed=True)


def scan_corpora(paths: Sequence[Path | str],
                 corpus_format: CorpusFormat = "auto") -> tuple[int, list[str]]:
    """Read every document of the corpus files once and check them as `load_corpora` does
    (each file non-empty, every record readable, ids unique across the files) without holding
    them: returns the number of documents and each file's format."""
    hashes = array("q")
    formats: list[str] = []
    for path in map(Path, paths):
        concrete = concrete_format(path, corpus_format)
        before = len(hashes)
        for document in iter_corpus(path, concrete):  # type: ignore[arg-type]
            hashes.append(_id_hash(document.id))
        if len(hashes) == before:
            raise DatasetError(f"corpus {path} is empty: it holds no documents")
        formats.append(concrete)
    ordered = np.sort(np.frombuffer(hashes, dtype=np.int64))
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if len(repeated):
        _name_duplicate_id(paths, formats, {int(h) for h in repeated})
    return len(hashes), formats


def _name_duplicate_id(paths: Sequence[Path | str], formats: Sequence[str],
                       suspects: set[int]) -> None:
    """Raise the error naming a duplicate id among the documents whose id hashes repeat
    (a second pass; two different ids sharing a hash are not an error)."""
    first_file: dict[str, Path] = {}
    for path, concrete in zip(map(Path, paths), formats, strict=True):
        for document in iter_corpus(path, concrete):  # type: ignore[arg-type]
            if _id_hash(document.id) not in suspects:
                continue
            if document.id in first_file:
                first = first_file[document.id]
                if first == path:
                    raise DatasetError(f"corpus {path}: duplicate document id {document.id!r}")
                raise DatasetError(f"corpus {path}: document id {document.id!r} is also in "
                                   f"{first}; ids must be unique across the corpus files")
            first_file[document.id] = path


def iter_corpora(paths: Sequence[Path | str], formats: Sequence[str]) -> Iterator[Document]:
    """The documents of several corpus files (each in its concrete format), in order."""
    for path, concrete in zip(paths, formats, strict=True):
        yield from iter_corpus(path, concrete)  # type: ignore[arg-type]


def load_corpora(paths: Sequence[Path | str],
                 corpus_format: CorpusFormat = "auto") -> tuple[list[Document], list[str]]:
    """Several corpus files as one corpus, and each file's format (`auto`: detected per
    file); ids must be unique across the files."""
    documents: list[Document] = []
    formats: list[str] = []
    first_file: dict[str, Path] = {}
    for path in map(Path, paths):
        concrete = concrete_format(path, corpus_format)
        for document in load_corpus(path, concrete):
            if document.id in first_file:
                raise DatasetError(f"corpus {path}: document id {document.id!r} is also in "
                                   f"{first_file[document.id]}; ids must be unique across "
                                   "the corpus files")
            first_file[document.id] = path
            documents.append(document)
        formats.append(concrete)
    return documents, formats
