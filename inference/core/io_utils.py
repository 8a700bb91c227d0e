"""Crash-safe file writing (whole files and folders via temp-then-rename, logs as jsonl) and
reading what the user hands in, every problem one error that names the file.

The one place that stages writes next to their target and renames them into place, so a
reader (or a crashed run) sees the old file or the whole new one, never half of either:

* `atomic_path(path)` — a temp file name for writers that want a path (FAISS, numpy);
* `atomic_file(path, mode)` — an open handle on such a temp file, fsynced before the rename;
* `write_atomic` / `write_json_atomic` — whole text or JSON in one call;
* `atomic_directory(path)` — a temp folder that replaces `path` whole;
* `JsonlLog` — append-only records for resumable work;
* `JsonlRecord` / `validated_record` — the typed form of a jsonl line, and reading one line
  into it (an unknown, missing or mistyped key is a `DatasetError` naming file, line and key);
* `parse_json(text, where)` — one JSON value; anything Python cannot read as one (bad
  syntax, bytes not UTF-8, an integer past Python's digit limit, nesting past its recursion
  limit) is a `DatasetError` (or the error class given) naming `where`;
* `read_text(path)` — a UTF-8 text file, or an error naming the file and the first bad line;
* `check_output_folder(path)` — refuse an output folder that a file stands in the way of;
* `cache_root()` — where everything sieverag caches lives ($SIEVERAG_CACHE).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TypeVar

from platformdirs import user_cache_dir
from pydantic import BaseModel, ConfigDict, ValidationError

from sieverag.inference.core.errors import (
    ConfigError,
    DatasetError,
    SieveragError,
    validation_problems,
)


def _staging_name(path: Path) -> dict[str, str]:
    # Hidden, next to the target (same file system, so the rename is atomic), and findable.
    path.parent.mkdir(parents=True, exist_ok=True)
    return {"dir": str(path.parent), "prefix": f".{path.name}.", "suffix": ".tmp"}


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp file name next to `path`; when the block succeeds the file written there
    replaces `path`, when it fails the temp file is removed and `path` is left as it was."""
    path = Path(path)
    fd, name = tempfile.mkstemp(**_staging_name(path))
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Yield an open handle (`mode` "w" text/utf-8 or "wb") whose file replaces `path` once
    the block succeeds and its bytes are on disk."""
    encoding = None if "b" in mode else "utf-8"
    with atomic_path(path) as tmp, open(tmp, mode, encoding=encoding) as handle:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())


def write_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` so readers see the old file or the new one, never half of one."""
    with atomic_file(path) as handle:
        handle.write(text)


def write_json_atomic(path: str | Path, payload: Any) -> None:
    """Write `payload` as indented UTF-8 JSON (newline-terminated) to `path`, atomically."""
    write_atomic(path, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a fresh temp folder next to `path`; when the block succeeds it replaces `path`
    whole, when it fails it is removed and `path` is left as it was."""
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(**_staging_name(path)))
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class JsonlRecord(BaseModel):
    """A record stored as one jsonl line: typed, unknown keys refused, checked on assignment.

    `to_json()` gives exactly the keys the record was built (or read) with: an optional key a
    writer leaves out stays absent from the line, so a line read and written again is the
    same line.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-ready data (the line's object)."""
        return self.model_dump(mode="json", exclude_unset=True)


Record = TypeVar("Record", bound=JsonlRecord)


def validated_record(model: type[Record], data: Any, path: str | Path, line: int) -> Record:
    """`data`, line `line` of `path`, as a `model`; otherwise a `DatasetError` naming the file,
    the line and each bad key by its dotted place in the record."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        problems = validation_problems(err)
        raise DatasetError(
            f"{path}, line {line}: not a valid {model.__name__} ({problems}); was it "
            "written by another sieverag version? fix or remove that line") from None


def parse_json(text: str | bytes, where: str, advice: str = "",
               error: type[Exception] = DatasetError) -> Any:
    """The JSON value of `text`, read from `where` (a file, or "FILE, line N"); text Python
    cannot read as JSON is one `error` naming `where`, then `advice` (what to do)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        place = (f"line {err.lineno}, " if err.lineno > 1 else "") + f"column {err.colno}"
        reason = f"not valid JSON ({err.msg} at {place})"
    except UnicodeDecodeError:
        reason = "is not UTF-8 text (re-encode the file as UTF-8)"
    except ValueError:  # json raises no other ValueError: an integer past Python's digit limit
        reason = (f"holds a number longer than the {sys.get_int_max_str_digits()} digits "
                  "Python reads")
    except RecursionError:
        reason = "is JSON nested too deeply to read"
    raise error(f"{where}: {reason}" + (f"; {advice}" if advice else "")) from None


def read_text(path: Path, error: type[SieveragError] = DatasetError) -> str:
    """The text of UTF-8 file `path`; bytes that are not UTF-8 or a file that cannot be read
    are one `error` naming the file (and the line of the first bad byte)."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise error(f"{path}: cannot be read ({err.strerror})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise error(f"{path}, line {line}: is not UTF-8 text; re-encode the file as "
                    "UTF-8") from None


def check_output_folder(path: str | Path) -> None:
    """Raise `ConfigError` when a file stands where output folder `path` (or a folder above
    it) must be: nothing could be written there."""
    path = Path(path)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"--out {path} cannot be a folder: {existing} is a file; give a "
                          "folder path (it is made when missing)")


class JsonlLog:
    """An append-only jsonl file of finished records; the unit of resumable work.

    Each record is flushed and fsynced as it is appended, so an interrupted run keeps every
    finished record; a torn last line (the process died mid-write) is dropped on reading.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def read(self) -> list[dict]:
        """All complete records; repairs a torn final line in place."""
        return [record for _, record in self._numbered()]

    def read_records(self, model: type[Record]) -> list[Record]:
        """All complete records as `model`s (see `validated_record`); repairs a torn final
        line in place."""
        return [validated_record(model, record, self.path, number)
                for number, record in self._numbered()]

    def _numbered(self) -> list[tuple[int, Any]]:
        """(1-based line number, record) of each complete line; repairs a torn final line."""
        if not self.path.exists():
            return []
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        records: list[tuple[int, Any]] = []
        good_bytes = 0
        for number, line in enumerate(lines, start=1):
            is_last = number == len(lines)
            if not line.strip():
                good_bytes += len(line) + (0 if is_last else 1)
                continue
            try:
                records.append((number, parse_json(line, f"{self.path}, line {number}",
                                                   "remove or fix that line to resume")))
            except DatasetError:
                if is_last:  # a torn final write: drop it, keep everything before
                    break
                raise
            good_bytes += len(line) + (0 if is_last else 1)
        if good_bytes < len(raw):
            with self.path.open("r+b") as handle:
                handle.truncate(good_bytes)
        elif raw and not raw.endswith(b"\n"):  # complete record, newline lost: restore it
            with self.path.open("ab") as handle:
                handle.write(b"\n")
        return records

    def append(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


def cache_root() -> Path:
    """Root of sieverag's cache: $SIEVERAG_CACHE, else the user cache dir.

    Everything sieverag caches (converted models, installed adapters, retrieval indexes) lives
    under it, so $SIEVERAG_CACHE moves all of it (the tests point it at a temporary folder).
    """
    return Path(os.environ.get("SIEVERAG_CACHE") or user_cache_dir("sieverag"))
