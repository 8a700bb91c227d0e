"""A tiny random LoRA adapter for the tiny test model, so MCF runs on a real adapter, and a
fixture that runs tiny-model test modules on one torch thread (import it to use it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


def make_lora_adapter(model_dir: Path, out: Path, seed: int = 1) -> Path:
    """Save a rank-4 LoRA on q_proj/v_proj with random (non-zero) B, so it changes outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8,
                                            target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5)
    model.save_pretrained(out)
    return out


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny-model tests run on one torch thread: a 2-layer model gains nothing from more, and
    on a busy machine contended threads made it an order of magnitude slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
