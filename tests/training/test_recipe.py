"""Recipe parsing: the shipped recipes parse, bad fields and values fail naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from repo_paths import REPO

from sieverag.inference.core.errors import ConfigError

ROOT = REPO
RECIPES = sorted((ROOT / "training" / "sft" / "recipes").glob("*.yaml"))
ACCELERATE_CONFIGS = sorted((ROOT / "accelerate_configs").glob("*.yaml"))


def parse(argv: list[str]):
    from sieverag.training.sft.recipe import parse_recipe

    return parse_recipe(argv)


def write_recipe(tmp_path: Path, body: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text("dataset_path: data\nbf16: false\nactivation_checkpointing: false\n" + body,
                    encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_shipped_recipes_parse(recipe: Path) -> None:
    import torch

    argv = ["--config", str(recipe)]
    if not torch.cuda.is_available():
        argv += ["--bf16", "false"]  # the GPU recipe asks for bf16, which a CPU cannot give
    parsed = parse(argv)
    assert parsed.model.use_peft
    assert parsed.training.max_length is not None
    assert parsed.training.seed is not None
    assert parsed.values["dataset_path"] == parsed.script.dataset_path


def test_cpu_recipe_fits_the_cpu() -> None:
    parsed = parse(["--config", str(ROOT / "training/sft/recipes/smollm2_filter_cpu.yaml")])
    assert parsed.training.bf16 is False
    assert parsed.training.activation_checkpointing is False
    assert parsed.training.eval_strategy == "steps"
    assert set(parsed.model.lora_target_modules) == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_flags_override_the_recipe(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "lora_r: 8\nlearning_rate: 2.0e-4\n")
    parsed = parse(["--config", recipe, "--lora_r", "4"])
    assert parsed.model.lora_r == 4
    assert parsed.training.learning_rate == pytest.approx(2e-4)
    assert parsed.overrides == ["--lora_r", "4"]


@pytest.mark.parametrize(("body", "named"), [
    ("lora_rank: 8\n", "'lora_rank'"),
    ("lora_r: 3.5\n", "field lora_r"),
    ("learning_rate: fast\n", "field learning_rate"),
    ("eval_strategy: often\n", "field eval_strategy"),
    ("bf16: maybe\n", "field bf16"),
    ("per_device_train_batch_size: [4]\n", "field per_device_train_batch_size"),
    ("lora_dropout: 1.5\n", "lora_dropout"),
    ("max_train_examples: 0\n", "max_train_examples"),
    ("use_peft: false\n", "use_peft"),
    ("eval_split: train\n", "eval_split"),
])
def test_bad_recipe_values_name_the_field(tmp_path: Path, body: str, named: str) -> None:
    recipe = write_recipe(tmp_path, body)
    with pytest.raises(ConfigError, match=named) as caught:
        parse(["--config", recipe])
    assert recipe in str(caught.value)


def test_unknown_field_suggests_the_close_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        parse(["--config", write_recipe(tmp_path, "learnig_rate: 0.1\n")])


def test_unknown_flag_and_missing_recipe(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "")
    with pytest.raises(ConfigError, match="--lora_rr"):
        parse(["--config", recipe, "--lora_rr", "4"])
    with pytest.raises(ConfigError, match="not found"):
        parse(["--config", str(tmp_path / "absent.yaml")])
    broken = tmp_path / "broken.yaml"
    broken.write_text("lora_r: [1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse(["--config", str(broken)])


@pytest.mark.parametrize(("body", "message"), [
    ("lora_r: [1\n", r"recipe\.yaml, line 5, column 1: not valid YAML \(expected ',' or "),
    ("lora_r: " + "[" * 100_000 + "]" * 100_000 + "\n", r"recipe\.yaml is nested too deeply"),
    ("lora_r: " + "7" * 5000 + "\n", r"recipe\.yaml holds a value that cannot be read"),
], ids=["not YAML", "nested 100,000 deep", "5,000-digit integer"])
def test_an_unreadable_recipe_is_one_line_naming_it(tmp_path: Path, body: str,
                                                    message: str) -> None:
    """The recipe is read as every sieverag config file is (`read_yaml_mapping`)."""
    with pytest.raises(ConfigError, match=message) as caught:
        parse(["--config", write_recipe(tmp_path, body)])
    assert "\n" not in str(caught.value)


def test_an_empty_recipe_is_named(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"recipe .*empty\.yaml is empty"):
        parse(["--config", str(empty)])


def test_dataset_path_is_required() -> None:
    with pytest.raises(ConfigError, match="dataset_path is required"):
        parse(["--bf16", "false"])


@pytest.mark.parametrize("config", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_accelerate_configs_load(config: Path) -> None:
    from accelerate.commands.config.config_args import ClusterConfig

    loaded = ClusterConfig.from_yaml_file(str(config))
    assert loaded.num_processes >= 1
    if "zero3" in config.name:
        assert loaded.deepspeed_config["zero3_save_16bit_model"] is True
    if config.name == "multi_gpu.yaml":
        assert (loaded.distributed_type.value, loaded.num_processes) == ("MULTI_GPU", 8)


def test_resume_picks_the_last_checkpoint(tmp_path: Path) -> None:
    from sieverag.training.sft.trainer import resume_checkpoint

    recipe = parse(["--config", write_recipe(tmp_path, ""), "--output_dir", str(tmp_path / "run")])
    assert resume_checkpoint(recipe) is None
    for step in (5, 10):
        (tmp_path / "run" / f"checkpoint-{step}").mkdir(parents=True)
    assert resume_checkpoint(recipe) == str(tmp_path / "run" / "checkpoint-10")
    recipe.script.auto_resume = False
    assert resume_checkpoint(recipe) is None
    recipe.training.resume_from_checkpoint = "last"
    assert resume_checkpoint(recipe) == str(tmp_path / "run" / "checkpoint-10")
    recipe.training.resume_from_checkpoint = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="not found"):
        resume_checkpoint(recipe)
