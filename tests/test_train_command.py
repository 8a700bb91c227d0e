"""`sieverag train`: a recipe by name or file, an accelerate config by name, overrides from
flags or YAML, the recipe checked before anything is launched, and a real launch."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from test_training_sft import write_filter_dataset

from sieverag.accelerate_configs import ACCELERATE_CONFIGS_DIR
from sieverag.cli import main
from sieverag.inference.errors import ConfigError
from sieverag.inference.settings import parse_settings
from sieverag.training.cli import RECIPES_DIR, TrainCommand, launch_command


def parse(argv: list[str]) -> TrainCommand:
    return parse_settings(TrainCommand, argv, "sieverag train")


def test_names_resolve_to_shipped_files_and_overrides_become_recipe_flags(tmp_path):
    settings = tmp_path / "train.yaml"
    settings.write_text("recipe: smollm2_filter_cpu\noverrides: {max_steps: 2}\n",
                        encoding="utf-8")
    command = parse(["--config", str(settings), "--accelerate-config", "zero2",
                     "--num-processes", "2"])
    argv = launch_command(command)
    assert argv[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert argv[argv.index("--config_file") + 1] == str(
        ACCELERATE_CONFIGS_DIR / "deepspeed_zero2.yaml")
    assert argv[argv.index("--num_processes") + 1] == "2"
    tail = argv[argv.index("-m", 3):]
    assert tail == ["-m", "sieverag.training.sft", "--config",
                    str(RECIPES_DIR / "smollm2_filter_cpu.yaml"), "--max_steps", "2"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--recipe", "no_such_recipe"], "neither a shipped recipe"),
    (["--recipe", "smollm2_filter_cpu", "--accelerate-config", "zero9"],
     "neither a shipped config"),
    (["--recipe", "smollm2_filter_cpu", "--overrides", "max_stepz=2"], "--max_stepz"),
])
def test_a_bad_recipe_or_config_fails_before_the_launch(argv, message, monkeypatch):
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("launched"))
    with pytest.raises(ConfigError, match=message):
        launch_command(parse(argv))


def test_train_launches_accelerate_and_saves_an_adapter(tmp_path, tiny_model_dir, capsys,
                                                        monkeypatch):
    data = write_filter_dataset(tmp_path / "data")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"dataset_path: {data}\nmodel_name_or_path: {tiny_model_dir}\n"
        f"output_dir: {tmp_path / 'run'}\nbf16: false\nactivation_checkpointing: false\n"
        "per_device_train_batch_size: 2\nlora_r: 4\nlora_alpha: 8\nreport_to: none\n"
        "eval_strategy: 'no'\nsave_strategy: 'no'\ndisable_tqdm: true\n"
        "dataloader_pin_memory: false\n", encoding="utf-8")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]))
    assert main(["train", "--recipe", str(recipe), "--overrides", "max_steps=1"]) == 0
    assert capsys.readouterr().out.startswith("launching: ")
    assert (tmp_path / "run" / "adapter_model.safetensors").stat().st_size > 0
