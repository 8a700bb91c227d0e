"""The filter adapter resolver, its card check, `filter install` and `filter package`, on the
tiny model with a random LoRA adapter (the shipped filter itself: test_shipped_filter.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from tiny_adapter import make_lora_adapter, one_torch_thread  # noqa: F401 (autouse)

from sieverag.cli import main
from sieverag.inference.filters import adapter_store
from sieverag.inference.filters.adapter_files import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    AdapterError,
    weights_sha256,
)
from sieverag.inference.filters.adapter_store import find_adapter, install_adapter, resolve_filter
from sieverag.inference.filters.card.card_file import CARD_FILE, check_card, filter_template_hashes
from sieverag.inference.filters.filter_format import chunk_record


@pytest.fixture(scope="module")
def lora(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_lora_adapter(tiny_model_dir, tmp_path_factory.mktemp("lora") / "my-filter")


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """An empty user cache and an empty shipped folder, both under tmp_path."""
    cache, shipped = tmp_path / "cache", tmp_path / "shipped"
    monkeypatch.setenv("SIEVERAG_CACHE", str(cache))
    monkeypatch.setattr(adapter_store, "SHIPPED_DIR", shipped)
    return cache / "adapters", shipped


def copy_adapter(source: Path, target: Path, card: dict | None = None) -> Path:
    target.mkdir(parents=True)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        (target / name).write_bytes((source / name).read_bytes())
    if card is not None:
        (target / CARD_FILE).write_text(json.dumps(card), encoding="utf-8")
    return target


def test_a_path_wins_then_the_cache_then_the_shipped_filter(lora, places, tmp_path):
    cache, shipped = places
    copy_adapter(lora, shipped / "smollm2-filter")
    assert find_adapter("smollm2-filter").source == "shipped"
    installed = install_adapter(lora, "smollm2-filter")
    assert installed == cache / "smollm2-filter"
    found = find_adapter("smollm2-filter")
    assert (found.source, found.path) == ("cache", installed)  # a retrained filter wins
    assert find_adapter(str(lora)).source == "path"
    with pytest.raises(AdapterError, match="'nope' is neither a folder nor the name.*"
                                           "known: smollm2-filter"):
        find_adapter("nope")
    with pytest.raises(AdapterError, match="adapter folder .*missing does not exist"):
        find_adapter(str(tmp_path / "missing"))


def test_filter_list_shows_what_is_found_where(lora, places, capsys):
    cache, shipped = places
    copy_adapter(lora, shipped / "smollm2-filter", {"base_model": "tiny"})
    install_adapter(lora, "smollm2-filter")
    copy_adapter(lora, shipped / "other")
    assert main(["filter", "list"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[1].split()[:4] == ["smollm2-filter", "cache", "yes", "–"]
    assert rows[2].split()[:4] == ["other", "shipped", "yes", "–"]
    assert rows[3].split()[:4] == ["smollm2-filter", "shipped", "shadowed", "tiny"]


def test_install_copies_only_the_adapter_files(lora, places, tmp_path):
    cache, _ = places
    run = copy_adapter(lora, tmp_path / "run", {"name": "filter-x"})
    (run / "checkpoint-25").mkdir()
    (run / "checkpoint-25" / "optimizer.pt").write_bytes(b"state")
    (run / "training_args.bin").write_bytes(b"args")
    assert main(["filter", "install", str(run), "--name", "mine"]) == 0
    assert sorted(p.name for p in (cache / "mine").iterdir()) == sorted(
        [CONFIG_FILE, WEIGHTS_FILE, CARD_FILE])


def test_install_takes_its_name_from_a_config_file_and_a_flag_overrides_it(lora, places,
                                                                            tmp_path, capsys):
    cache, _ = places
    config = tmp_path / "install.yaml"
    config.write_text("name: from-file\n", encoding="utf-8")
    assert main(["filter", "install", str(lora), "--config", str(config)]) == 0
    assert main(["filter", "install", str(lora), "--config", str(config), "--name", "flag"]) == 0
    assert sorted(p.name for p in cache.iterdir()) == ["flag", "from-file"]
    capsys.readouterr()
    assert main(["filter", "list"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:3]
    assert sorted(row.split()[:2] for row in rows) == [["flag", "cache"], ["from-file", "cache"]]


def test_install_without_a_path_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["filter", "install", "--name", "mine"])
    assert exit_info.value.code == 2
    assert "the following arguments are required: PATH" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["filter", "install", "x", "--config", "{config}"], "nmae: unknown setting"),
    (["filter", "package", "run", "--out", "o", "--check-passages", "0"],
     "check_passages must be >= 1, got 0"),
])
def test_filter_commands_refuse_bad_settings_by_name(places, tmp_path, capsys, argv, message):
    config = tmp_path / "bad.yaml"
    config.write_text("nmae: typo\n", encoding="utf-8")
    assert main([a.format(config=config) for a in argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("breakage", "message"), [
    ("not an adapter", "has no adapter_config.json"),
    ("card does not parse", "sieverag_adapter.json: not valid JSON"),
    ("no safetensors", "has no adapter_model.safetensors"),
    ("corrupt safetensors", "adapter_model.safetensors is not a readable safetensors file"),
    ("other prompts", "trained with the prompt template filter_chunk \\(sha256 0000"),
])
def test_a_failed_install_names_the_file_and_overwrites_nothing(lora, places, tmp_path,
                                                                breakage, message, capsys):
    cache, _ = places
    install_adapter(lora, "smollm2-filter")
    before = {p.name: p.read_bytes() for p in (cache / "smollm2-filter").iterdir()}
    bad = copy_adapter(lora, tmp_path / "bad")
    if breakage == "not an adapter":
        (bad / CONFIG_FILE).unlink()
    elif breakage == "card does not parse":
        (bad / CARD_FILE).write_text("{not json", encoding="utf-8")
    elif breakage == "other prompts":
        (bad / CARD_FILE).write_text(json.dumps({"prompt_templates": {"filter_chunk": "00" * 32}}),
                                     encoding="utf-8")
    elif breakage == "no safetensors":
        (bad / WEIGHTS_FILE).unlink()
    else:
        (bad / WEIGHTS_FILE).write_bytes(b"\xff" * 64)
    assert main(["filter", "install", str(bad), "--name", "smollm2-filter"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert re.search(message, error), error
    after = {p.name: p.read_bytes() for p in (cache / "smollm2-filter").iterdir()}
    assert after == before


def test_a_card_for_other_weights_or_other_prompts_is_refused(lora, tiny_model_dir, tmp_path):
    good = {"base_model": "tiny", "base_model_sha256": weights_sha256(tiny_model_dir),
            "prompt_templates": filter_template_hashes()}
    check_card(copy_adapter(lora, tmp_path / "good", good), tiny_model_dir)

    other_base = copy_adapter(lora, tmp_path / "other-base",
                              {**good, "base_model_sha256": "ab" * 32})
    with pytest.raises(AdapterError) as refused:
        resolve_filter(str(other_base), str(tiny_model_dir))
    message = str(refused.value)
    assert "trained on base model tiny (weights sha256 abababababababab…)" in message
    assert f"{tiny_model_dir}, has weights sha256 {good['base_model_sha256'][:16]}" in message

    prompts = {**good["prompt_templates"], "filter_chunk": "cd" * 32}
    other_prompts = copy_adapter(lora, tmp_path / "other-prompts",
                                 {**good, "prompt_templates": prompts})
    with pytest.raises(AdapterError, match="prompt template filter_chunk \\(sha256 "
                                           "cdcdcdcdcdcdcdcd…\\), but the template in use"):
        resolve_filter(str(other_prompts), str(tiny_model_dir))


def test_weights_hash_follows_the_tensors_not_the_file_layout(tmp_path):
    import torch
    from safetensors.torch import save_file

    tensors = {"b": torch.ones(2, 3), "a": torch.arange(4.0)}
    for name, meta in (("one", {"format": "pt"}), ("two", {"format": "pt", "note": "x"})):
        (tmp_path / name).mkdir()
        save_file(dict(reversed(list(tensors.items()))) if name == "two" else tensors,
                  tmp_path / name / "model.safetensors", metadata=meta)
    assert weights_sha256(tmp_path / "one") == weights_sha256(tmp_path / "two")
    (tmp_path / "three").mkdir()
    save_file({**tensors, "a": torch.arange(4.0) + 1}, tmp_path / "three" / "model.safetensors")
    assert weights_sha256(tmp_path / "three") != weights_sha256(tmp_path / "one")


def _training_run(lora: Path, tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A training output folder as training.sft leaves it, with its dataset folder."""
    data = tmp_path / "dataset"
    data.mkdir()
    with (data / "validation.jsonl").open("w", encoding="utf-8") as handle:
        for i in range(5):
            handle.write(json.dumps(chunk_record(
                question=f"Who built bridge {i}?", chunk_text=f"Bridge {i} was built by Ana.",
                relevant=i % 2 == 0, source="hotpotqa", question_id=f"q{i}")) + "\n")
    return copy_adapter(lora, tmp_path / "run", {
        "name": "filter-tiny-1234abcd", "base_model": str(tiny_model_dir),
        "base_model_path": str(tiny_model_dir),
        "base_model_sha256": weights_sha256(tiny_model_dir),
        "prompt_templates": filter_template_hashes(),
        "dataset": {"path": str(data), "fingerprint": "f" * 16,
                    "train_questions": [["hotpotqa", "q9"]]},
        "recipe": {"values": {"learning_rate": 0.002}}, "metrics": {"eval_loss": 0.15}})


def test_package_writes_bf16_weights_a_public_config_and_a_card(lora, tiny_model_dir,
                                                                tmp_path, capsys):
    from safetensors import safe_open

    run = _training_run(lora, tiny_model_dir, tmp_path)
    (run / "checkpoint-25").mkdir()
    # The combination `sieverag train` fitted on its validation split.
    fitted = {"weights": {"filter_log_odds": 1.3}, "bias": -0.4, "bar": 0.35,
              "datasets": ["hotpotqa_sample.jsonl"], "questions": [["hotpotqa", "q1"]]}
    run_card = json.loads((run / CARD_FILE).read_text(encoding="utf-8"))
    (run / CARD_FILE).write_text(json.dumps({**run_card, "combination": fitted}),
                                 encoding="utf-8")
    out = tmp_path / "shipped" / "tiny-filter"
    assert main(["filter", "package", str(run), "--out", str(out), "--name", "tiny-filter",
                 "--check-passages", "4"]) == 0
    assert "P(Yes) of the bf16 adapter within" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == sorted([CONFIG_FILE, WEIGHTS_FILE,
                                                            CARD_FILE])
    with safe_open(out / WEIGHTS_FILE, "pt") as weights:
        assert {str(weights.get_tensor(k).dtype) for k in weights.keys()} == {"torch.bfloat16"}
    config = json.loads((out / CONFIG_FILE).read_text(encoding="utf-8"))
    assert config["base_model_name_or_path"] == str(tiny_model_dir)  # not embedded: as given
    card = json.loads((out / CARD_FILE).read_text(encoding="utf-8"))
    assert card["name"] == "tiny-filter" and card["trained_as"] == "filter-tiny-1234abcd"
    assert card["base_model_sha256"] == weights_sha256(tiny_model_dir)
    assert card["prompt_templates"] == filter_template_hashes("two_stage")
    assert card["dataset"]["train_questions"] == [["hotpotqa", "q9"]]
    assert card["dataset"]["path"] == "dataset"  # no path of the training machine
    assert card["weights"]["p_yes_check"]["passages"] == 4
    check = card["weights"]["p_yes_check"]
    assert 0 <= check["max_abs_diff_vs_trained"] < check["tolerance"] == 1e-2
    # On the training device, in the training precision (the tiny run records none: float32).
    assert (check["base_dtype"], check["device"]) == (
        "float32", "cuda:0" if torch.cuda.is_available() else "cpu")
    assert card["combination"] == fitted  # the packaged filter ranks as the trained one
    # The packaged filter resolves and fits its base model.
    assert resolve_filter(str(out), str(tiny_model_dir)) == out


def test_package_refuses_when_bf16_moves_the_scores_and_leaves_out_as_it_was(
        lora, tiny_model_dir, tmp_path):
    from sieverag.inference.filters.packaging import package_filter

    run = _training_run(lora, tiny_model_dir, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old", encoding="utf-8")
    with pytest.raises(AdapterError, match="bf16 weights of .* move P\\(Yes\\) by up to"):
        package_filter(run, out, check_passages=4, max_p_yes_diff=0.0)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    with pytest.raises(AdapterError, match="has no sieverag_adapter.json"):
        package_filter(lora, tmp_path / "x")


def test_package_checks_a_bf16_recipe_in_bf16_with_no_float32_copy(lora, tiny_model_dir,
                                                                   tmp_path, monkeypatch):
    """A run trained in bf16 (the GPU recipes) is checked over a bf16 base on the training
    device: the base is loaded once, in bf16, never in float32 (32 GB for an 8B model)."""
    import functools
    import shutil

    from sieverag.inference.filters.packaging import package_filter, training_dtype
    from sieverag.inference.llm import hf

    base = shutil.copytree(tiny_model_dir, tmp_path / "base")  # loaded by no other test
    run = _training_run(lora, tiny_model_dir, tmp_path)
    card = json.loads((run / CARD_FILE).read_text(encoding="utf-8"))
    card.update(base_model=str(base), base_model_path=str(base),
                recipe={"model": {"dtype": "bfloat16"}, "training": {"bf16": True}})
    (run / CARD_FILE).write_text(json.dumps(card), encoding="utf-8")
    loads: list[tuple[str, torch.dtype, str]] = []
    load = hf._load_causal_lm.__wrapped__

    def recorded(path: str, dtype: torch.dtype, device: str):
        loads.append((path, dtype, device))
        return load(path, dtype, device)

    monkeypatch.setattr(hf, "_load_causal_lm", functools.cache(recorded))
    packaged = package_filter(run, tmp_path / "out", check_passages=4)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert loads == [(str(base), torch.bfloat16, device)]
    assert (packaged.check_dtype, packaged.check_device) == ("bfloat16", device)
    check = json.loads((tmp_path / "out" / CARD_FILE).read_text(encoding="utf-8"))[
        "weights"]["p_yes_check"]
    assert (check["base_dtype"], check["device"], check["tolerance"]) == ("bfloat16", device,
                                                                         1e-2)
    assert 0 <= check["max_abs_diff_vs_trained"] <= 1e-2
    # The training precision: the recipe's model dtype, else its mixed precision, else float32.
    assert training_dtype({"recipe": {"model": {"dtype": "auto"},
                                      "training": {"bf16": True}}}) == "bfloat16"
    assert training_dtype({"recipe": {"training": {"fp16": True}}}) == "float16"
    assert training_dtype({}) == "float32"


DEEP = "[" * 100_000 + "]" * 100_000
BIG_NUMBER = "7" * 5000


@pytest.mark.parametrize(("file", "content", "named"), [
    ("dataset/validation.jsonl", b'{"task": "\xff"}\n', "validation.jsonl, line 1: is not UTF-8"),
    ("dataset/validation.jsonl", f'{{"task": {BIG_NUMBER}}}\n',
     "validation.jsonl, line 1: holds a number longer than"),
    ("dataset/validation.jsonl", DEEP + "\n", "validation.jsonl, line 1: is JSON nested too deep"),
    ("dataset/validation.jsonl", "[1]\n", "validation.jsonl, line 1: is not a JSON object"),
    ("dataset/validation.jsonl", '{"task": "chunk"}\n',
     "validation.jsonl, line 1: not a build-dataset record (no 'prompt')"),
    ("dataset/train.jsonl", "{half\n", "train.jsonl, line 1: not valid JSON"),
    ("dataset/train.jsonl", DEEP + "\n", "train.jsonl, line 1: is JSON nested too deep"),
    ("eval/report.json", b'{"chunk": "\xff"}', "report.json, line 1: is not UTF-8"),
    ("eval/report.json", f'{{"chunk": {BIG_NUMBER}}}', "report.json: holds a number longer than"),
    ("eval/report.json", DEEP, "report.json: is JSON nested too deep"),
    ("eval/report.json", "[1]", "report.json is not an eval-filter report"),
], ids=["validation not UTF-8", "validation 5,000-digit integer", "validation nested deep",
        "validation line not an object", "validation line without a prompt",
        "train not JSON", "train nested deep", "report not UTF-8", "report 5,000-digit integer",
        "report nested deep", "report not an object"])
def test_package_names_a_bad_dataset_or_report_file_and_writes_nothing(
        lora, tiny_model_dir, tmp_path, capsys, file, content, named):
    """Every file `filter package` reads is read before any model loads; a bad one is one line
    naming it (and its line), exit code 2, and --out is not made."""
    run = _training_run(lora, tiny_model_dir, tmp_path)
    card = json.loads((run / CARD_FILE).read_text(encoding="utf-8"))
    if file.endswith("train.jsonl"):  # only read when the run recorded no training questions
        del card["dataset"]["train_questions"]
        (run / CARD_FILE).write_text(json.dumps(card), encoding="utf-8")
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "report.json").write_text(json.dumps(
        {"chunk": {}, "questions": {"evaluated": 1}}), encoding="utf-8")
    target = tmp_path / file
    if isinstance(content, bytes):
        target.write_bytes(content)
    else:
        target.write_text(content, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["filter", "package", str(run), "--out", str(out), "--check-passages", "4",
                 "--eval-filter", str(tmp_path / "eval")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error, error
    assert named in error
    assert not out.exists()
