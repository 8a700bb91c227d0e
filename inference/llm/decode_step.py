"""One decode step of a Llama-family model, written out: the embedded server's and the `hf`
backend's token-by-token loop.

A decode step feeds each row one token and reads one row of logits. Through transformers'
`model(...)` it pays for the general forward: mask building, output dataclasses, hooks and,
behind PEFT, a wrapper around every projection. For SmolLM2-135M on 2 CPU cores that
overhead was a quarter of a step (54 ms through the model, 40 ms here, batch 1, float32, a
300-token cache). `DecodeStep` runs the same operations on the model's own weights (no copy)
in the same order, so its logits are bit-identical to the model's at float32: the same
RMSNorm, rotary embedding (the model's own `rotary_emb`), projections (a LoRA adapter's
`x·Aᵀ·Bᵀ·scale` added as PEFT adds it), and attention as transformers' SDPA path calls it (a
padded batch through the query packed per key/value head and a boolean mask; an unpadded one
through `enable_gqa`).

A step may also feed several tokens a row: a prompt-lookup draft that the `hf` backend checks
in one pass (inference/llm/prompt_lookup.py), each token attending to the cache and the ones
before it.

It covers `LlamaForCausalLM` with SDPA attention, no biases and plain LoRA adapters (what
`supports` checks); any other model keeps the model's own forward (`Decoder`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache

# One LoRA adapter's change to a projection: its A and B matrices and its scale.
Lora = tuple[torch.Tensor, torch.Tensor, float]


@dataclass(frozen=True)
class _Projection:
    weight: torch.Tensor
    loras: dict[str, Lora]  # by adapter name: the adapters that change this projection

    def __call__(self, x: torch.Tensor, adapter: str | None) -> torch.Tensor:
        out = F.linear(x, self.weight)
        lora = self.loras.get(adapter)  # None for the base, or an adapter that skips it
        if lora is not None:
            a, b, scale = lora
            out = out + F.linear(F.linear(x.to(a.dtype), a), b) * scale
        return out


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor
    q: _Projection
    k: _Projection
    v: _Projection
    o: _Projection
    post_norm: torch.Tensor
    gate: _Projection
    up: _Projection
    down: _Projection


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a PEFT wrapper (the model itself otherwise)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def supports(model: torch.nn.Module) -> bool:
    """Whether `DecodeStep` computes what `model`'s forward computes for one new token."""
    inner = _unwrapped(model)
    config = getattr(inner, "config", None)
    if type(inner).__name__ != "LlamaForCausalLM" or config is None:
        return False
    plain = (not config.attention_bias and not config.mlp_bias and config.hidden_act == "silu"
             and getattr(config, "pretraining_tp", 1) == 1
             and config._attn_implementation == "sdpa")
    return plain and all(_projection_or_none(m) is not None
                         for layer in inner.model.layers for m in _modules_of(layer))


def _modules_of(layer: torch.nn.Module) -> list[torch.nn.Module]:
    attention, mlp = layer.self_attn, layer.mlp
    return [attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj,
            mlp.gate_proj, mlp.up_proj, mlp.down_proj]


def _projection_or_none(module: torch.nn.Module) -> _Projection | None:
    """A projection read from a plain `nn.Linear` or a PEFT LoRA `Linear` around one; None for
    anything else (DoRA, other tuners, quantised layers)."""
    if type(module) is torch.nn.Linear:
        return _Projection(module.weight, {})
    base = getattr(module, "base_layer", None)
    if type(base) is not torch.nn.Linear or not hasattr(module, "lora_A"):
        return None
    if any(getattr(module, "use_dora", {}).values()) or getattr(module, "lora_bias", {}) and any(
            module.lora_bias.values()):
        return None
    loras = {name: (module.lora_A[name].weight, module.lora_B[name].weight,
                    module.scaling[name]) for name in module.lora_A}
    return _Projection(base.weight, loras)


class DecodeStep:
    """Logits of the new tokens of each row of a `supports`-ed model, as its forward gives
    them: bit for bit for one token a row, to float rounding for a checked draft."""

    def __init__(self, model: torch.nn.Module) -> None:
        if not supports(model):
            raise ValueError(f"{type(_unwrapped(model)).__name__} is not a model DecodeStep "
                             "computes; check `supports` first")
        inner = _unwrapped(model)
        config = inner.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = self.head_dim ** -0.5
        self.eps = config.rms_norm_eps
        self.embed = inner.model.embed_tokens.weight
        self.rotary = inner.model.rotary_emb
        self.final_norm = inner.model.norm.weight
        self.head = inner.lm_head.weight
        self.layers = []
        for layer in inner.model.layers:
            q, k, v, o, gate, up, down = (_projection_or_none(m) for m in _modules_of(layer))
            self.layers.append(_Layer(layer.input_layernorm.weight, q, k, v, o,
                                      layer.post_attention_layernorm.weight, gate, up, down))

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                 attention_mask: torch.Tensor, cache: Cache, *, adapter: str | None = None,
                 before_layer: Callable[[int], None] | None = None) -> torch.Tensor:
        """Logits [rows, tokens, vocabulary] after feeding `input_ids` ([rows, tokens]) at
        `position_ids` ([rows, tokens]) to the rows of `cache`, which takes their keys and
        values. One token a row is a decode step (bit-identical to the forward); several are a
        draft being checked, each token seeing the ones before it (to float rounding: the
        products then run on more rows).

        `attention_mask` ([rows, columns]) covers the cache's columns and the new ones;
        `adapter` names the LoRA adapter to add (a PEFT adapter name; None: the base);
        `before_layer` is called with each decoder layer's index before it runs (it may raise
        to stop the step)."""
        rows, length = input_ids.shape
        hidden = F.embedding(input_ids, self.embed)
        cos, sin = self.rotary(hidden, position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        mask = self._mask(attention_mask, length)
        for index, (layer, cache_layer) in enumerate(zip(self.layers, cache.layers, strict=True)):
            if before_layer is not None:
                before_layer(index)
            residual = hidden
            normed = self._rms_norm(hidden, layer.input_norm)
            query = self._heads(layer.q(normed, adapter), rows, length, self.heads)
            key = self._heads(layer.k(normed, adapter), rows, length, self.kv_heads)
            value = self._heads(layer.v(normed, adapter), rows, length, self.kv_heads)
            query = query * cos + _rotate_half(query) * sin
            key = key * cos + _rotate_half(key) * sin
            keys, values = cache_layer.update(key, value)
            attended = self._attend(query, keys, values, mask, rows, length)
            hidden = residual + layer.o(attended, adapter)
            residual = hidden
            normed = self._rms_norm(hidden, layer.post_norm)
            gate, up = layer.gate(normed, adapter), layer.up(normed, adapter)
            hidden = residual + layer.down(F.silu(gate) * up, adapter)
        return F.linear(self._rms_norm(hidden, self.final_norm), self.head)

    @staticmethod
    def _mask(attention_mask: torch.Tensor, length: int) -> torch.Tensor | None:
        """The boolean mask SDPA reads ([rows, 1, tokens, columns]), or None for none.

        For one token, as transformers builds it: an all-ones mask dropped (attention through
        enable_gqa), a padded batch's kept as a boolean mask (the query then packed per
        key/value head). Several tokens add the causal part: the i-th new token sees the
        cache and new tokens up to itself."""
        if length == 1:
            return None if bool(attention_mask.all()) else attention_mask.bool()[:, None, None, :]
        columns = attention_mask.shape[1]
        device = attention_mask.device
        visible = (torch.arange(columns, device=device)[None, :]
                   <= torch.arange(columns - length, columns, device=device)[:, None])
        return attention_mask.bool()[:, None, None, :] & visible[None, None]

    def _rms_norm(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        dtype = hidden.dtype
        hidden = hidden.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return weight * (hidden * torch.rsqrt(variance + self.eps)).to(dtype)

    def _heads(self, projected: torch.Tensor, rows: int, length: int, heads: int
               ) -> torch.Tensor:
        return projected.view(rows, length, heads, self.head_dim).transpose(1, 2)

    def _attend(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor | None, rows: int, length: int) -> torch.Tensor:
        if mask is None or length > 1:
            out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask,
                                                 scale=self.scale, enable_gqa=True)
        else:
            packed = query.reshape(rows, self.kv_heads, self.heads // self.kv_heads,
                                   self.head_dim)
            out = F.scaled_dot_product_attention(packed, keys, values, attn_mask=mask,
                                                 scale=self.scale)
        out = out.reshape(rows, -1, length, self.head_dim).transpose(1, 2)
        return out.reshape(rows, length, -1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Decoder:
    """What a decode loop calls for a step's logits (or a draft's): `DecodeStep` where the
    model `supports` it, else the model's own forward (with its active adapter; the decoder
    layers' forward hooks then run as `before_layer` would)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.step = DecodeStep(model) if supports(model) else None

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                 attention_mask: torch.Tensor, cache: Cache, *, adapter: str | None = None,
                 before_layer: Callable[[int], None] | None = None) -> torch.Tensor:
        """Logits [rows, tokens, vocabulary]; the arguments are `DecodeStep`'s."""
        if self.step is not None:
            return self.step(input_ids, position_ids, attention_mask, cache, adapter=adapter,
                             before_layer=before_layer)
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids, cache=cache, use_cache=True).logits
