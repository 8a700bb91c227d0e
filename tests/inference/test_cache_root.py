"""One cache root for everything sieverag caches, and the tests' own temporary one."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from platformdirs import user_cache_dir

from sieverag.inference.cli.index import default_eval_index_dir
from sieverag.inference.core.io_utils import cache_root
from sieverag.inference.llm import model_resolution
from sieverag.inference.retrieval.config import IndexConfig


def test_under_pytest_the_cache_is_a_temporary_folder_not_the_users() -> None:
    root = cache_root().resolve()
    users = Path(user_cache_dir("sieverag")).resolve()
    assert root != users and not root.is_relative_to(users)
    assert root.is_relative_to(Path(tempfile.gettempdir()).resolve())
    assert root.is_dir()


def test_without_sieverag_cache_the_root_is_the_users_cache(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIEVERAG_CACHE")
    assert cache_root() == Path(user_cache_dir("sieverag"))


def test_every_cached_thing_lives_under_the_root(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIEVERAG_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "cache"
    assert model_resolution.adapters_dir() == root / "adapters"
    index = default_eval_index_dir("squad", IndexConfig(dense=None), tmp_path / "squad.zip")
    assert index.parent == root / "retrieval" and index.name.startswith("squad-")
