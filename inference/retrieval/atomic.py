"""Writes that never leave a half-written file behind: write to a temp name, then rename."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np


@contextmanager
def _temp_file_for(path: Path, mode: str) -> Iterator[Any]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path`; readers see either the old file or the whole new one."""
    with _temp_file_for(path, "w") as handle:
        handle.write(text)


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write `payload` as indented JSON to `path`, atomically."""
    write_text_atomic(path, json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


def write_lines_atomic(path: Path, lines: Iterable[str]) -> None:
    """Write one line per item (newline added) to `path`, atomically."""
    with _temp_file_for(path, "w") as handle:
        for line in lines:
            handle.write(line)
            handle.write("\n")


def save_npy_atomic(path: Path, array: np.ndarray) -> None:
    """Save `array` in .npy format to `path`, atomically."""
    with _temp_file_for(path, "wb") as handle:
        np.save(handle, array, allow_pickle=False)


@contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """Yield a fresh temp folder next to `path`; on success it replaces `path` whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
