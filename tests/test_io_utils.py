"""Crash-safe writes and the resumable jsonl log."""

from __future__ import annotations

import pytest

from inference.errors import DatasetError
from inference.io_utils import JsonlLog, write_atomic


def test_write_atomic_replaces_and_leaves_no_temp(tmp_path):
    path = tmp_path / "sub" / "a.json"
    write_atomic(path, "one")
    write_atomic(path, "two")
    assert path.read_text() == "two"
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]


def test_jsonl_log_appends_and_repairs_a_torn_last_line(tmp_path):
    log = JsonlLog(tmp_path / "r.jsonl")
    log.append({"id": "a"})
    log.append({"id": "b"})
    with log.path.open("a") as handle:
        handle.write('{"id": "c", "partial')  # the process died mid-write
    assert [r["id"] for r in log.read()] == ["a", "b"]
    log.append({"id": "c"})
    assert [r["id"] for r in log.read()] == ["a", "b", "c"]


def test_jsonl_log_restores_a_lost_final_newline(tmp_path):
    log = JsonlLog(tmp_path / "r.jsonl")
    log.path.write_text('{"id": "a"}')
    assert log.read() == [{"id": "a"}]
    log.append({"id": "b"})
    assert [r["id"] for r in log.read()] == ["a", "b"]


def test_jsonl_log_refuses_a_corrupt_middle_line(tmp_path):
    log = JsonlLog(tmp_path / "r.jsonl")
    log.path.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(DatasetError, match="line 2"):
        log.read()
