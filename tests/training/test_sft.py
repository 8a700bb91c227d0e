"""Training runs on the tiny random model through `accelerate launch`, and the adapter checks.

Each run trains 2 steps on a tiny dataset in the real record format, in a subprocess under
an accelerate config. The launched script is `training.sft.trainer.main` with one extra callback
that snapshots every parameter before training and records, after training, which ones
changed: LoRA weights must have changed, base weights must not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sft_runs import assert_trained_adapter, launch_training


def test_two_steps_under_cpu_config(tiny_model_dir: Path, filter_dataset: Path,
                                    tmp_path: Path) -> None:
    out = tmp_path / "run"
    weights = launch_training("cpu.yaml", filter_dataset, tiny_model_dir, out)
    assert_trained_adapter(out, tiny_model_dir, weights)


# ----- the adapter check on hand-made adapters (the ZeRO-3 trap and friends) -----


@pytest.fixture
def saved_adapter(tiny_model_dir: Path, tmp_path: Path) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                           LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                      task_type="CAUSAL_LM"))
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter)
    model.save_pretrained(tmp_path / "adapter")
    return tmp_path / "adapter"


def _rewrite(adapter: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    path = adapter / "adapter_model.safetensors"
    save_file(change(load_file(path)), path)


def test_sound_adapter_passes(saved_adapter: Path, tiny_model_dir: Path) -> None:
    from sieverag.training.sft.adapter import verify_adapter

    check = verify_adapter(saved_adapter, tiny_model_dir)
    assert check.tensors == 8 and check.parameters > 0 and check.file_bytes > 0


@pytest.mark.parametrize(("change", "message"), [
    (lambda t: {k: torch.empty(0) for k in t}, "is empty"),
    (lambda t: dict(list(t.items())[1:]), "lacks 1 of 8 LoRA tensors"),
    (lambda t: {k: torch.zeros_like(v) if "lora_B" in k else v for k, v in t.items()},
     "every lora_B weight is zero"),
    (lambda t: {k: v[:2] if "lora_A" in k else v for k, v in t.items()}, "does not reload"),
    (lambda t: {k: torch.full_like(v, float("nan")) for k, v in t.items()}, "NaN"),
])
def test_broken_adapters_fail_clearly(saved_adapter: Path, tiny_model_dir: Path, change,
                                      message: str) -> None:
    from sieverag.training.sft.adapter import AdapterSaveError, verify_adapter

    _rewrite(saved_adapter, change)
    with pytest.raises(AdapterSaveError, match=message):
        verify_adapter(saved_adapter, tiny_model_dir)


def test_zero_byte_adapter_names_the_zero3_setting(saved_adapter: Path,
                                                   tiny_model_dir: Path) -> None:
    from sieverag.training.sft.adapter import AdapterSaveError, verify_adapter

    (saved_adapter / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(AdapterSaveError, match="zero3_save_16bit_model"):
        verify_adapter(saved_adapter, tiny_model_dir)


def test_adapter_name_is_unique_per_weights(saved_adapter: Path) -> None:
    from sieverag.training.sft.adapter import adapter_name

    first = adapter_name("smollm2-135m-instruct", saved_adapter)
    assert first.startswith("filter-smollm2-135m-instruct-") and len(first.split("-")[-1]) == 8
    _rewrite(saved_adapter, lambda t: {k: v * 2 for k, v in t.items()})
    assert adapter_name("smollm2-135m-instruct", saved_adapter) != first


def test_a_run_whose_one_step_is_in_warmup_is_untrained_and_says_so(
        tiny_model_dir: Path, filter_dataset: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A linear warmup starts at learning rate 0, so a one-step run (the README's
    two-question sample under the CPU recipe) saves B = 0: not a failed save."""
    from safetensors.torch import load_file

    from sieverag.inference.filters.adapter_files import WEIGHTS_FILE
    from sieverag.training.sft.recipe import parse_recipe
    from sieverag.training.sft.trainer import train

    out = train(parse_recipe([
        "--dataset_path", str(filter_dataset), "--model_name_or_path", str(tiny_model_dir),
        "--output_dir", str(tmp_path / "run"), "--max_steps", "1", "--warmup_steps", "10",
        "--per_device_train_batch_size", "2", "--lora_r", "4", "--lora_alpha", "8",
        "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none",
        "--disable_tqdm", "true", "--activation_checkpointing", "false"]))
    assert "note: the run's one optimizer step had learning rate 0" in capsys.readouterr().out
    weights = load_file(out / WEIGHTS_FILE)
    assert not any(t.abs().sum() > 0 for name, t in weights.items() if "lora_B" in name)


def test_scoring_label_positions_only_gives_the_same_loss_and_gradients(
        tiny_model_dir: Path) -> None:
    """TRL's fused LM head over the trained positions only (the default) against every
    position (TRL's choice off Triton): the same loss, accuracy and LoRA gradients, on fewer
    rows of the LM head."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from trl.trainer import utils as trl_utils

    from sieverag.training.sft.trainer import score_positions

    torch.manual_seed(0)
    ids = torch.randint(5, 1000, (2, 12))
    labels = torch.full_like(ids, -100)
    labels[0, 9:11], labels[1, 6:8] = ids[0, 9:11], ids[1, 6:8]  # each row's completion
    rows_scored: list[int] = []
    chunked = trl_utils._ChunkedLogProbFunction.apply

    def counted(hidden, *args):
        rows_scored.append(hidden.shape[0])
        return chunked(hidden, *args)

    results = {}
    try:
        trl_utils._ChunkedLogProbFunction.apply = counted
        for label_only in (False, True):
            score_positions(label_only=label_only)
            model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
            trl_utils.add_fused_lm_head(model, outputs=("log_probs", "is_top1"))
            torch.manual_seed(1)
            model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"],
                                                     init_lora_weights=False))
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels,
                        fused_lm_head=True)
            out.loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            results[label_only] = (out.loss.detach(), out.is_top1.sum(), grads)
    finally:
        trl_utils._ChunkedLogProbFunction.apply = chunked
        score_positions(label_only=True)
    (every_loss, every_top1, every_grads), (only_loss, only_top1, only_grads) = \
        results[False], results[True]
    torch.testing.assert_close(only_loss, every_loss)
    assert only_top1 == every_top1
    assert every_grads.keys() == only_grads.keys() and every_grads
    for name, grad in every_grads.items():
        torch.testing.assert_close(only_grads[name], grad)
    assert rows_scored == [2 * 11, 4]  # every shifted position, then the 4 labelled ones


def test_lora_on_the_upper_layers_only(tiny_model_dir: Path) -> None:
    """`lora_layers_from` puts LoRA on the decoder layers from that index up, and names the
    model's layer count when it is past the last."""
    from sieverag.inference.core.errors import ConfigError
    from sieverag.training.sft.sft_config import FilterModelConfig
    from sieverag.training.sft.trainer import lora_config

    config = lora_config(FilterModelConfig(model_name_or_path=str(tiny_model_dir),
                                           lora_layers_from=1), tiny_model_dir)
    assert config.layers_to_transform == [1]  # the tiny model has 2 layers
    assert lora_config(FilterModelConfig(model_name_or_path=str(tiny_model_dir)),
                       tiny_model_dir).layers_to_transform is None
    with pytest.raises(ConfigError, match="lora_layers_from=2: .* has 2 decoder layers"):
        lora_config(FilterModelConfig(model_name_or_path=str(tiny_model_dir),
                                      lora_layers_from=2), tiny_model_dir)
    with pytest.raises(ConfigError, match="lora_layers_from must be >= 0"):
        FilterModelConfig(lora_layers_from=-1)


def test_the_card_records_the_lengths_of_the_records_trained_on(tiny_model_dir: Path) -> None:
    """`dataset.record_tokens`: what a served filter's window is read from."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from sieverag.inference.filters.filter_format import chunk_record
    from sieverag.training.sft.data import record_length, record_token_lengths

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    records = Dataset.from_list([
        chunk_record(question="Where?", chunk_text="word " * n, relevant=n > 5, source="s",
                     question_id=str(n), evidence={"note": "x"}) for n in (1, 5, 20, 40)])
    lengths = sorted(record_length(record, tokenizer) for record in records)
    assert record_token_lengths(records, tokenizer) == {
        "max": lengths[-1], "median": lengths[2], "p95": lengths[-1]}
    assert record_token_lengths(records.select([]), tokenizer) == {}
