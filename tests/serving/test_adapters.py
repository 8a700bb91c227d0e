"""`--adapter` arguments: NAME=PATH parsing, content-hashed default names, LoRA ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sieverag.serving.adapters import parse_adapter, resolve_adapters
from sieverag.serving.errors import AdapterError


def write_adapter(folder: Path, *, r: object = 8, weights: bytes = b"weights",
                  **extra: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "r": r, "target_modules": ["q_proj", "v_proj"], **extra}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


def test_name_equals_path(tmp_path: Path) -> None:
    folder = write_adapter(tmp_path / "ckpt", r=16)
    adapter = parse_adapter(f"filter-v1.2={folder}")
    assert (adapter.name, adapter.path, adapter.rank) == ("filter-v1.2", folder.resolve(), 16)


def test_bare_path_is_named_by_folder_and_content_hash(tmp_path: Path) -> None:
    first = parse_adapter(str(write_adapter(tmp_path / "a" / "filter", weights=b"v1")))
    same = parse_adapter(str(write_adapter(tmp_path / "b" / "filter", weights=b"v1")))
    retrained = parse_adapter(str(write_adapter(tmp_path / "c" / "filter", weights=b"v2")))
    assert first.name.startswith("filter-") and len(first.name) == len("filter-") + 8
    assert first.name == same.name  # same content, same name
    assert retrained.name != first.name  # a reused folder name never reuses a served name


def test_folder_whose_name_holds_equals_sign_is_a_bare_path(tmp_path: Path) -> None:
    folder = write_adapter(tmp_path / "lr=1e-4")
    assert parse_adapter(str(folder)).path == folder.resolve()


def test_largest_rank_counts_rank_pattern(tmp_path: Path) -> None:
    folder = write_adapter(tmp_path / "x", r=8, rank_pattern={"q_proj": 40})
    assert parse_adapter(str(folder)).rank == 40


@pytest.mark.parametrize(("setup", "message"), [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: p, "has no adapter_config.json"),
    (lambda p: write_adapter(p / "a", peft_type="IA3"), "not a LoRA adapter"),
    (lambda p: write_adapter(p / "a", r=0), "no valid LoRA rank"),
])
def test_unusable_folders_are_refused_clearly(tmp_path: Path, setup, message: str) -> None:
    with pytest.raises(AdapterError, match=message):
        parse_adapter(str(setup(tmp_path)))


def test_bad_name_is_refused(tmp_path: Path) -> None:
    folder = write_adapter(tmp_path / "a")
    with pytest.raises(AdapterError, match="NAME made of letters"):
        parse_adapter(f"my adapter={folder}")


def test_names_must_be_unique_and_differ_from_the_base(tmp_path: Path) -> None:
    first, second = write_adapter(tmp_path / "a"), write_adapter(tmp_path / "b")
    with pytest.raises(AdapterError, match="given twice"):
        resolve_adapters([f"f={first}", f"f={second}"], base_name="base")
    with pytest.raises(AdapterError, match="base model's name"):
        resolve_adapters([f"base={first}"], base_name="base")
    assert [a.name for a in resolve_adapters([f"f={first}", f"g={second}"], "base")] == ["f", "g"]
