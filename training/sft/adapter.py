"""The saved LoRA adapter: the post-save check, its unique name, and its metadata file.

`verify_adapter` guards against the known trap of LoRA under DeepSpeed ZeRO-3 (and any other
way of saving from sharded parameters): an `adapter_model.safetensors` that exists but holds
no weights, or zero-sized ones. It checks the file as written, then reloads it with PEFT onto
an empty-weight copy of the base model (no base weights are read, so it is cheap for an 8B
base too) and compares every expected LoRA tensor's name and shape with the file.

`sieverag_adapter.json` beside the weights records what the adapter is: its unique served
name, the base model, the dataset fingerprint, the recipe and the metrics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sieverag.inference.core.errors import SieveragError
from sieverag.inference.core.io_utils import write_atomic
from sieverag.inference.filters.adapter_files import CONFIG_FILE, WEIGHTS_FILE, content_name
from sieverag.inference.filters.card.card_file import CARD_FILE

ZERO3_HINT = ("under DeepSpeed ZeRO-3 the sharded LoRA weights must be gathered before saving "
              "(the trainer's save_model does it, a model's own save_pretrained does not): "
              "save through sieverag.training.sft with --accelerate-config zero3 "
              "(zero3_save_16bit_model: true)")


class AdapterSaveError(SieveragError):
    """A saved adapter is missing, empty, or does not reload with PEFT."""


@dataclass(frozen=True)
class AdapterCheck:
    """What `verify_adapter` found in a sound adapter."""

    tensors: int
    parameters: int
    file_bytes: int


def verify_adapter(adapter_dir: str | Path, base_model_dir: str | Path, *,
                   require_trained: bool = True) -> AdapterCheck:
    """Check a saved LoRA adapter is non-empty, finite and reloadable onto its base model.

    `require_trained` also demands that some `lora_B` weight is non-zero (LoRA starts B at
    zero, so an all-zero B means no update reached the saved weights). Raises
    `AdapterSaveError` naming the folder and the problem.
    """
    import torch
    from safetensors.torch import load_file

    folder = Path(adapter_dir)
    weights = folder / WEIGHTS_FILE
    if not (folder / CONFIG_FILE).is_file():
        raise AdapterSaveError(f"adapter {folder} has no {CONFIG_FILE}: the save did not finish")
    if not weights.is_file() or weights.stat().st_size == 0:
        raise AdapterSaveError(f"adapter {folder} has an empty or missing {WEIGHTS_FILE}; "
                               + ZERO3_HINT)
    try:
        tensors = load_file(weights)
    except Exception as err:  # safetensors raises its own error types for a corrupt file
        raise AdapterSaveError(f"cannot read {weights}: {err}") from err
    if not tensors:
        raise AdapterSaveError(f"{weights} holds no tensors; " + ZERO3_HINT)
    for name, tensor in tensors.items():
        if tensor.numel() == 0:
            raise AdapterSaveError(f"{weights}: tensor {name} is empty (shape "
                                   f"{tuple(tensor.shape)}); " + ZERO3_HINT)
        if not torch.isfinite(tensor.float()).all():
            raise AdapterSaveError(f"{weights}: tensor {name} holds NaN or inf values; the "
                                   "training diverged (lower learning_rate)")
    if require_trained and not any(t.abs().sum() > 0 for n, t in tensors.items()
                                   if "lora_B" in n):
        raise AdapterSaveError(f"{weights}: every lora_B weight is zero, so the adapter "
                               "changes nothing: no optimizer step reached the saved weights")
    _check_reloads(folder, Path(base_model_dir), {k: tuple(v.shape) for k, v in tensors.items()})
    return AdapterCheck(tensors=len(tensors), parameters=sum(t.numel() for t in tensors.values()),
                        file_bytes=weights.stat().st_size)


def _check_reloads(folder: Path, base_model_dir: Path, saved: dict[str, tuple[int, ...]]) -> None:
    """Reload with PEFT onto an empty-weight base; every expected LoRA tensor must be saved."""
    from accelerate import init_empty_weights
    from peft import PeftModel, get_peft_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    with init_empty_weights():
        base = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(base_model_dir, local_files_only=True))
    try:
        model = PeftModel.from_pretrained(base, folder, low_cpu_mem_usage=True)
    except Exception as err:  # PEFT reports shape and config problems as various errors
        raise AdapterSaveError(f"adapter {folder} does not reload onto {base_model_dir} with "
                               f"PEFT: {str(err).splitlines()[0]}") from err
    expected = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}
    missing = sorted(set(expected) - set(saved))
    if missing:
        raise AdapterSaveError(f"adapter {folder} lacks {len(missing)} of {len(expected)} LoRA "
                               f"tensors (first: {missing[0]}); " + ZERO3_HINT)
    wrong = [k for k in expected if expected[k] != saved[k]]
    if wrong:
        raise AdapterSaveError(f"adapter {folder}: tensor {wrong[0]} has shape "
                               f"{saved[wrong[0]]}, expected {expected[wrong[0]]}")


def adapter_name(base_model: str, adapter_dir: str | Path) -> str:
    """`filter-<base model name>-<hash8>` (`content_name`): unique per weights."""
    return content_name(f"filter-{Path(base_model).name.lower()}", adapter_dir)


def write_adapter_metadata(adapter_dir: str | Path, metadata: dict[str, Any]) -> Path:
    """Write `sieverag_adapter.json` atomically (temp file, then rename)."""
    target = Path(adapter_dir) / CARD_FILE
    write_atomic(target, json.dumps(metadata, indent=2, default=str) + "\n")
    return target
