"""Every recipe field reaches what it configures: the base model's load (dtype, attention
kernel), LoRA, the batches (padding-free packing, activation checkpointing), the data
(subsets, splits, long records); a field sieverag's training does not use is refused naming
it; the one private TRL helper `training.sft.trainer.score_positions` sets is pinned to the TRL
source it was checked against. The trainers are built, not trained (`sft.build_trainer`)."""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path

import pytest
import torch
from repo_paths import REPO
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

from sieverag.inference.core.errors import ConfigError
from sieverag.training.sft.recipe import UNUSED_FIELDS, parse_recipe
from sieverag.training.sft.sft_config import FLASH_OR_SDPA

RECIPES = REPO / "training" / "sft" / "recipes"
# What a CPU changes in the 8B recipes (float32, no DeepSpeed, no workers).
ON_CPU = ["--bf16", "false", "--dtype", "float32", "--use_cpu", "true",
          "--dataloader_num_workers", "0", "--report_to", "none", "--disable_tqdm", "true"]
# The TRL source `score_positions` relies on: the fused LM head scores only the labelled
# positions where `trl.trainer.utils._use_triton(device)` is true (checked on TRL 1.16.0).
TRL_PINNED = {
    "trl.trainer.utils.add_fused_lm_head":
        "422d009f04b66659982f9545a90d560bdcc27fde3268de203d0c5c6d1449d211",
    "trl.kernels.chunked_logprob._use_triton":
        "f0510984e05ac05ca2f579b67776cafaf22c0602a9810e4f28c808896864f095",
}


def build(argv: list[str]):
    from sieverag.training.sft.trainer import build_trainer

    return build_trainer(parse_recipe(argv))


def base_argv(dataset: Path, model: Path, out: Path) -> list[str]:
    return ["--dataset_path", str(dataset), "--model_name_or_path", str(model),
            "--output_dir", str(out), "--save_strategy", "no", "--eval_strategy", "no",
            "--bf16", "false", "--use_cpu", "true", "--report_to", "none",
            "--activation_checkpointing", "false"]


def base_parameter(model: torch.nn.Module) -> torch.nn.Parameter:
    return next(p for n, p in model.named_parameters() if "lora" not in n)


def test_every_model_field_reaches_the_model(filter_dataset: Path, tiny_model_dir: Path,
                                             tmp_path: Path, capsys) -> None:
    defaults, _ = build(base_argv(filter_dataset, tiny_model_dir, tmp_path / "a"))
    peft = defaults.model.peft_config["default"]
    assert base_parameter(defaults.model).dtype == torch.float32
    assert (peft.r, peft.lora_alpha, peft.use_rslora, peft.use_dora) == (16, 32, False, False)
    assert defaults.args.activation_checkpointing is False
    assert not defaults.padding_free

    changed, run = build([
        *base_argv(filter_dataset, tiny_model_dir, tmp_path / "b"),
        "--dtype", "bfloat16", "--attn_implementation", "eager", "--lora_r", "4",
        "--lora_alpha", "8", "--lora_dropout", "0.2", "--lora_target_modules", "q_proj",
        "v_proj", "--lora_modules_to_save", "lm_head", "--use_rslora", "true",
        "--use_dora", "true", "--lora_layers_from", "1", "--activation_checkpointing", "true",
        "--packing", "true", "--packing_strategy", "bfd", "--max_length", "200",
        "--max_train_examples", "5", "--score_label_positions_only", "false"])
    model, peft = changed.model, changed.model.peft_config["default"]
    assert base_parameter(model).dtype == torch.bfloat16
    assert model.config._attn_implementation == "eager"
    assert (peft.r, peft.lora_alpha, peft.lora_dropout) == (4, 8, 0.2)
    assert set(peft.target_modules) == {"q_proj", "v_proj"}
    assert (peft.use_rslora, peft.use_dora, peft.layers_to_transform) == (True, True, [1])
    assert "lm_head" in peft.modules_to_save
    # The trainer turns activation checkpointing on in the model when training starts.
    assert changed.args.activation_checkpointing is True
    assert changed.padding_free and "seq_lengths" in changed.train_dataset.column_names
    assert sum(map(len, changed.train_dataset["seq_lengths"])) == 5  # 5 records, packed
    assert max(map(len, changed.train_dataset["input_ids"])) <= 200
    assert run.used["train"].num_rows == 5
    import trl.trainer.utils as trl_utils
    from trl.kernels.chunked_logprob import _use_triton

    assert trl_utils._use_triton is _use_triton  # every position scored, as asked
    said = capsys.readouterr().out
    assert "attention: eager" in said and "chat template: tokenizer" in said


def test_flash_or_sdpa_resolves_at_load_and_says_which(monkeypatch) -> None:
    import transformers.utils

    from sieverag.training.sft.trainer import attention_implementation

    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: False)
    assert attention_implementation(FLASH_OR_SDPA)[0] == "sdpa"
    assert "flash-attn is not installed" in attention_implementation(FLASH_OR_SDPA)[1]
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: True)
    assert attention_implementation(FLASH_OR_SDPA) == (
        "flash_attention_2", f"attention: flash_attention_2 (attn_implementation "
                             f"{FLASH_OR_SDPA}: flash-attn is installed)")
    assert attention_implementation("eager")[0] == "eager"


@pytest.mark.parametrize("recipe", ["llama3_8b_filter_zero3", "qwen2_5_7b_filter_zero3"])
def test_the_8b_recipes_fields_reach_the_trainer(recipe: str, filter_dataset: Path,
                                                 tiny_model_dir: Path, tmp_path: Path) -> None:
    """Each training field the recipe sets is the trainer's (none rewritten on the way), and
    its model fields are the model's: sdpa here (no flash-attn), padding-free packed rows,
    activation checkpointing."""
    path = RECIPES / f"{recipe}.yaml"
    parsed = parse_recipe(["--config", str(path), *ON_CPU])
    trainer, _ = build(["--config", str(path), *ON_CPU, "--dataset_path", str(filter_dataset),
                        "--model_name_or_path", str(tiny_model_dir),
                        "--output_dir", str(tmp_path / "out")])
    trainer_fields = {f for f in parsed.values if hasattr(parsed.training, f)}
    assert {"packing", "packing_strategy", "activation_checkpointing", "max_length",
            "learning_rate"} <= trainer_fields
    for name in trainer_fields - {"output_dir", "dataset_path", "dataloader_num_workers",
                                  "bf16", "report_to"}:
        assert getattr(trainer.args, name) == getattr(parsed.training, name), name
    assert parsed.model.attn_implementation == FLASH_OR_SDPA
    assert trainer.model.config._attn_implementation == "sdpa"
    assert trainer.padding_free and trainer.args.packing_strategy == "bfd"
    assert trainer.args.activation_checkpointing is True
    assert parsed.values["bf16"] is True and parsed.values["dtype"] == "bfloat16"


UNUSED_VALUES = {"model_revision": "v2", "load_in_8bit": "true", "load_in_4bit": "true",
                 "bnb_4bit_quant_type": "fp4", "use_bnb_nested_quant": "true",
                 "bnb_4bit_quant_storage": "uint8", "chat_template_path": "my.jinja",
                 "dataset_text_field": "content", "assistant_only_loss": "true"}


@pytest.mark.parametrize("name", sorted(UNUSED_FIELDS))
def test_a_field_training_does_not_use_is_refused_naming_it(name: str) -> None:
    with pytest.raises(ConfigError, match=f"field {name} is not used by sieverag's training"):
        parse_recipe(["--dataset_path", "data", f"--{name}", UNUSED_VALUES[name]])


def test_model_init_kwargs_may_not_set_a_model_field_again(filter_dataset: Path,
                                                           tiny_model_dir: Path,
                                                           tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model_init_kwargs sets dtype"):
        build([*base_argv(filter_dataset, tiny_model_dir, tmp_path),
               "--model_init_kwargs", '{"dtype": "bfloat16"}'])


def test_padding_free_needs_a_kernel_that_keeps_records_apart(filter_dataset: Path,
                                                              tiny_model_dir: Path,
                                                              tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="padding_free/packing needs attn_implementation"):
        build([*base_argv(filter_dataset, tiny_model_dir, tmp_path), "--padding_free", "true",
               "--attn_implementation", "paged|sdpa"])


@pytest.mark.parametrize("architecture", ["llama3", "qwen2"])
def test_padding_free_sdpa_gives_the_padded_loss(architecture: str, tiny_model_dir: Path,
                                                 tmp_path: Path) -> None:
    """Where flash-attn is absent the 8B recipes pack with sdpa: two records laid end to end
    with restarting position_ids (TRL's padding-free batch) score as the two padded rows."""
    from tiny_model import save_tiny_architecture
    from transformers import AutoModelForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    folder = save_tiny_architecture(tmp_path / architecture, architecture, False,
                                    tokenizer_from=tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    torch.manual_seed(0)
    records = [{"input_ids": torch.randint(5, 1000, (n,)).tolist()} for n in (9, 14)]
    losses = {}
    for padding_free in (False, True):
        batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=padding_free)(
            records)
        with torch.no_grad():  # no cache, as the trainer runs it (TRL sets use_cache=False)
            losses[padding_free] = model(**batch, use_cache=False).loss
    torch.testing.assert_close(losses[True], losses[False])


def test_the_private_trl_helper_is_pinned_to_the_trl_it_was_checked_on() -> None:
    """`training.sft.trainer.score_positions` replaces `trl.trainer.utils._use_triton`, which TRL's
    fused LM head reads to score only the labelled positions. When TRL changes either
    function, check that `add_fused_lm_head` still reads `_use_triton(hidden_states.device)`
    to choose that (tests/training/test_sft.py's label-positions test must pass), then
    update the hashes here."""
    import trl.kernels.chunked_logprob as kernels
    import trl.trainer.utils as trl_utils

    sources = {"trl.trainer.utils.add_fused_lm_head": trl_utils.add_fused_lm_head,
               "trl.kernels.chunked_logprob._use_triton": kernels._use_triton}
    found = {name: hashlib.sha256(inspect.getsource(function).encode()).hexdigest()
             for name, function in sources.items()}
    changed = [name for name in TRL_PINNED if found[name] != TRL_PINNED[name]]
    assert not changed, (f"TRL changed {', '.join(changed)}, which training.sft.trainer."
                         "score_positions relies on: check it and update TRL_PINNED")
    assert "compact = _use_triton(hidden_states.device)" in inspect.getsource(
        trl_utils.add_fused_lm_head)
