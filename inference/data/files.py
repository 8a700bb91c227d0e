"""Reading dataset files: jsonl (gzip-compressed or not, told by content), parquet (told by
content) and whole JSON documents (zipped or not). Every problem ends in one `DatasetError`
that names the file, and the line or row where there is one."""

from __future__ import annotations

import gzip
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.core.io_utils import parse_json

Record = dict[str, Any]
"""One JSON object of a dataset file (a jsonl line, or a nested record)."""

_GZIP_MAGIC = b"\x1f\x8b"
_PARQUET_MAGIC = b"PAR1"
_PARQUET_BATCH_ROWS = 1024
_JSON_TYPE_NAMES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def json_type(value: Any) -> str:
    """How a JSON value is named in error messages ("an object", "null", ...)."""
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def check_readable(path: Path) -> None:
    """Raise `DatasetError` unless `path` is an existing file."""
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
    check_readable(path)
    line_number = 0
    try:
        with _open_text(path) as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                record = parse_json(line, f"{path}, line {line_number}",
                                    "fix or remove the line")
                if not isinstance(record, dict):
                    raise DatasetError(
                        f"{path}, line {line_number}: is {json_type(record)}, "
                        "expected a JSON object"
                    )
                yield line_number, record
    except UnicodeDecodeError:
        raise DatasetError(
            f"{path}, line {line_number + 1}: is not UTF-8 text; re-encode the file as UTF-8"
        ) from None
    except (OSError, EOFError) as err:
        raise DatasetError(f"{path}: cannot be read ({err})") from None


def is_parquet(path: Path) -> bool:
    """Whether `path` is a parquet file (by its first bytes)."""
    with path.open("rb") as handle:
        return handle.read(len(_PARQUET_MAGIC)) == _PARQUET_MAGIC


def parquet_columns(path: Path) -> list[str]:
    """The column names of a parquet file (read from its footer, no rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return list(pq.read_schema(path).names)
    except (OSError, pa.ArrowException) as err:
        raise DatasetError(f"{path}: cannot be read as parquet ({err})") from None


def iter_parquet(path: Path) -> Iterator[tuple[int, Record]]:
    """(0-based row number, record) for each row of a parquet file, read in batches."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    number = 0
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=_PARQUET_BATCH_ROWS)
        for batch in batches:
            for record in batch.to_pylist():
                yield number, record
                number += 1
    except (OSError, pa.ArrowException) as err:
        raise DatasetError(f"{path}, row {number}: cannot be read as parquet ({err})") from None


def load_json_document(path: Path) -> Any:
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
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        raise DatasetError(f"{where}: cannot be read ({err})") from None
    return parse_json(raw, where)
