"""The written-out decode step computes what the model's forward computes, bit for bit at
float32: padded and unpadded batches, the engine's growing cache and the stock one, the base
and a LoRA adapter; models it does not cover keep their forward."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from sieverag.inference.llm import kv
from sieverag.inference.llm.decode_step import Decoder, DecodeStep, supports

PROMPTS = [[5, 17, 29, 41, 53, 65, 77], [9, 8, 7], [100, 200, 300, 400, 500]]
STEPS = 6


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> torch.nn.Module:
    # A private copy: the tests below wrap it in PEFT, which edits a model in place.
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True).eval()


@pytest.fixture(scope="module")
def with_lora(model: torch.nn.Module) -> torch.nn.Module:
    """The model under PEFT with two random LoRA adapters (B not zero, so each one counts):
    one on every projection, one on the attention's query and value only."""
    from peft import LoraConfig, get_peft_model

    every = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj",
                                                          "o_proj", "gate_proj", "up_proj",
                                                          "down_proj"])
    peft_model = get_peft_model(copy.deepcopy(model), every, adapter_name="one")
    peft_model.add_adapter("two", LoraConfig(r=2, lora_alpha=4,
                                             target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.05)
    return peft_model.eval()


Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, object], torch.Tensor]


def decode(model: torch.nn.Module, prompts: list[list[int]], step: Forward, growing: bool,
           after_prefill: Callable[[], object] = lambda: None
           ) -> tuple[torch.Tensor, list[list[int]]]:
    """Greedy decoding of `prompts` (left-padded; prefilled by `model`'s forward, then
    `after_prefill` is called) for STEPS steps with `step`: every step's logits stacked
    [steps, rows, vocabulary], and the tokens chosen."""
    inputs = kv.left_pad(prompts, 0)
    cache = kv.growing_cache(model.config, "tiny") if growing else None
    with torch.inference_mode():
        output = model(**inputs, cache=cache, use_cache=True, logits_to_keep=1)
        cache, logits = output.cache, output.logits[:, -1, :]
        mask, positions = inputs["attention_mask"], inputs["position_ids"][:, -1:]
        after_prefill()
        steps, tokens = [], []
        for _ in range(STEPS):
            chosen = logits.argmax(dim=-1, keepdim=True)
            tokens.append(chosen[:, 0].tolist())
            mask = torch.cat([mask, mask.new_ones((len(prompts), 1))], dim=1)
            positions = positions + 1
            logits = step(chosen, positions, mask, cache)
            steps.append(logits)
    return torch.stack(steps), tokens


def through_forward(model: torch.nn.Module) -> Forward:
    def step(ids, positions, mask, cache):
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                     use_cache=True).logits[:, -1, :]
    return step


def through_decode_step(model: torch.nn.Module, adapter: str | None = None) -> Forward:
    written = DecodeStep(model)

    def step(ids, positions, mask, cache):
        return written(ids, positions, mask, cache, adapter=adapter)[:, -1, :]
    return step


@pytest.mark.parametrize("prompts", [PROMPTS, PROMPTS[:1]], ids=["padded", "one row"])
@pytest.mark.parametrize("growing", [True, False], ids=["growing cache", "stock cache"])
def test_the_step_gives_the_forward_s_logits_bit_for_bit(
        model: torch.nn.Module, prompts: list[list[int]], growing: bool) -> None:
    expected, expected_tokens = decode(model, prompts, through_forward(model), growing)
    got, tokens = decode(model, prompts, through_decode_step(model), growing)
    assert torch.equal(got, expected)
    assert tokens == expected_tokens


@pytest.mark.parametrize("adapter", ["one", "two", None])
def test_an_adapter_adds_what_peft_adds(with_lora: torch.nn.Module, model: torch.nn.Module,
                                        adapter: str | None) -> None:
    """Each adapter, named per step, matches the PEFT model with that adapter set; no adapter
    matches the plain base model."""
    if adapter is None:
        expected, _ = decode(model, PROMPTS, through_forward(model), True)
    else:
        with_lora.set_adapter(adapter)
        expected, _ = decode(with_lora, PROMPTS, through_forward(with_lora), True)
    # Prefilled as the adapter, then the other one set: the step reads the adapter it is given.
    other = "two" if adapter == "one" else "one"
    got, _ = decode(model if adapter is None else with_lora, PROMPTS,
                    through_decode_step(with_lora, adapter), True,
                    after_prefill=lambda: with_lora.set_adapter(other))
    assert torch.equal(got, expected)
    base, _ = decode(model, PROMPTS, through_forward(model), True)
    assert adapter is None or not torch.equal(got, base)  # the adapter changed something


def test_before_layer_sees_every_layer_in_order_and_may_stop_the_step(
        model: torch.nn.Module) -> None:
    seen: list[int] = []

    class Stop(Exception):
        pass

    def stop_at_second(index: int) -> None:
        seen.append(index)
        if len(seen) == model.config.num_hidden_layers + 2:
            raise Stop

    step = DecodeStep(model)
    inputs = kv.left_pad(PROMPTS, 0)
    with torch.inference_mode():
        cache = model(**inputs, use_cache=True).cache
        mask = torch.cat([inputs["attention_mask"], torch.ones((3, 1), dtype=torch.long)], 1)
        ids, positions = torch.ones((3, 1), dtype=torch.long), inputs["position_ids"][:, -1:] + 1
        step(ids, positions, mask, cache, before_layer=stop_at_second)
        with pytest.raises(Stop):
            step(ids, positions + 1, torch.cat([mask, mask[:, :1]], 1), cache,
                 before_layer=stop_at_second)
    layers = list(range(model.config.num_hidden_layers))
    assert seen == layers + layers[:2]


def test_models_it_does_not_cover_keep_their_forward(model: torch.nn.Module) -> None:
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"
    biased = LlamaForCausalLM(LlamaConfig(**{**model.config.to_dict(), "attention_bias": True,
                                             "num_hidden_layers": 1})).eval()
    assert supports(model)
    for other in (eager, biased):
        assert not supports(other)
        decoder = Decoder(other)
        assert decoder.step is None
        with pytest.raises(ValueError, match="not a model DecodeStep computes"):
            DecodeStep(other)
        expected, _ = decode(other, PROMPTS, through_forward(other), True)
        got, _ = decode(other, PROMPTS, lambda i, p, m, c, d=decoder: d(i, p, m, c)[:, -1, :], True)
        assert torch.equal(got, expected)
