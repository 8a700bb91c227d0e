"""Crash-safe file writing: whole files via temp-then-rename, logs as append-only jsonl."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from inference.errors import DatasetError


def write_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` so readers see the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class JsonlLog:
    """An append-only jsonl file of finished records; the unit of resumable work.

    Each record is flushed and fsynced as it is appended, so an interrupted run keeps every
    finished record; a torn last line (the process died mid-write) is dropped on reading.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def read(self) -> list[dict]:
        """All complete records; repairs a torn final line in place."""
        if not self.path.exists():
            return []
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        records: list[dict] = []
        good_bytes = 0
        for number, line in enumerate(lines, start=1):
            is_last = number == len(lines)
            if not line.strip():
                good_bytes += len(line) + (0 if is_last else 1)
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                if is_last:  # a torn final write: drop it, keep everything before
                    break
                raise DatasetError(f"{self.path} line {number} is not valid JSON ({err}); "
                                   "remove or fix that line to resume") from err
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
