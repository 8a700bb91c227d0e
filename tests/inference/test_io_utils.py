"""Crash-safe writes and the resumable jsonl log."""

from __future__ import annotations

import pytest

from sieverag.inference.core.errors import DatasetError
from sieverag.inference.core.io_utils import (
    JsonlLog,
    atomic_directory,
    atomic_file,
    atomic_path,
    write_atomic,
    write_json_atomic,
)


def test_write_atomic_replaces_and_leaves_no_temp(tmp_path):
    path = tmp_path / "sub" / "a.json"
    write_atomic(path, "one")
    write_atomic(path, "two")
    assert path.read_text() == "two"
    assert [p.name for p in path.parent.iterdir()] == ["a.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "a.bin"
    write_atomic(path, "old")
    with pytest.raises(RuntimeError), atomic_file(path, "wb") as handle:
        handle.write(b"half")
        raise RuntimeError("crash mid-write")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_binary_and_json_writes(tmp_path):
    with atomic_file(tmp_path / "b.bin", "wb") as handle:
        handle.write(b"\x00\x01")
    write_json_atomic(tmp_path / "c.json", {"name": "Mānoa"})
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "c.json").read_text("utf-8") == '{\n  "name": "Mānoa"\n}\n'


def test_atomic_directory_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "index"
    with atomic_directory(target) as tmp:
        (tmp / "one").write_text("1")
    with pytest.raises(RuntimeError), atomic_directory(target) as tmp:
        (tmp / "two").write_text("2")
        raise RuntimeError("crash mid-build")
    assert [p.name for p in target.iterdir()] == ["one"]
    with atomic_directory(target) as tmp:
        (tmp / "three").write_text("3")
    assert [p.name for p in target.iterdir()] == ["three"]
    assert [p.name for p in tmp_path.iterdir()] == ["index"]


def test_jsonl_log_appends_and_repairs_a_torn_last_line(tmp_path):
    log = JsonlLog(tmp_path / "r.jsonl")
    log.append({"id": "a"})
    log.append({"id": "b"})
    with log.path.open("a") as handle:
        handle.write('{"id": "c", "partial')  # the process died mid-write
    assert [r["id"] for r in log.read()] == ["a", "b"]
    log.append({"id": "c"})
    assert [r["id"] for r in log.read()] == ["a", "b", "c"]


def test_jsonl_log_drops_a_last_line_torn_inside_a_character(tmp_path):
    log = JsonlLog(tmp_path / "r.jsonl")
    log.append({"id": "a"})
    with log.path.open("ab") as handle:
        handle.write('{"id": "é'.encode()[:-1])  # died mid-write, inside a two-byte character
    assert log.read() == [{"id": "a"}]
    assert log.path.read_text(encoding="utf-8") == '{"id": "a"}\n'


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
