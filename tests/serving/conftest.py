"""Fixtures shared by the serving tests (the session-wide ones are in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_adapter import make_lora_adapter


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random LoRA adapter on the tiny model, with a filter card (one per test module)."""
    return make_lora_adapter(tiny_model_dir, tmp_path_factory.mktemp("lora"))
