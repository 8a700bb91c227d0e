"""KV caches and left padding, for every user of an in-process model: the `hf` backend, CXMI
scoring and the embedded server.

- `left_pad`: token-id rows to left-padded `input_ids` / `attention_mask` / `position_ids`;
  positions count real tokens only, from an offset (the length of a cached prefix).
- `prefill`, `expand_cache`, `continue_inputs`: run a shared prefix once, repeat its cache for
  a batch, and build the inputs that run each row's own tokens after a cache.
- `cache_layers`, `cache_from_layers`, `select_rows`: a cache's per-layer keys and values, a
  `DynamicCache` built from them, and a cache cut down to chosen rows.
- `GrowingLayer`, `growing_cache`, `make_growing`, `join_rows`, `drop_padding_columns`: the
  cache of a batch that decodes continuously, written in place, joined by new rows and
  trimmed.
- `eos_token_ids`: the token ids that end a reply.

Every cache follows the transformers 5 interface: a forward pass takes it as `cache=` and
returns it as `.cache`; a `DynamicCache` is built from `ddp_cache_data` and the model config.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from sieverag.inference.core.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

Layers = list[tuple[torch.Tensor, torch.Tensor]]


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int, *,
             offset: int | torch.Tensor = 0, device: torch.device | str | None = None
             ) -> dict[str, torch.Tensor]:
    """Left-padded ids, their attention mask and position ids (pads masked, positions counting
    real tokens only and starting at `offset`; a CPU column tensor gives each row its own)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        mask[row, width - len(seq):] = 1
    # Positions count real tokens only, so a left-padded row scores like an unpadded one.
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0) + torch.as_tensor(offset)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device),
            "position_ids": positions.to(device)}


def prefill(model: torch.nn.Module, prefix_ids: Sequence[int],
            device: torch.device | str) -> Cache:
    """The cache of `prefix_ids` run once through `model` (one row, positions from 0)."""
    prefix = torch.tensor([list(prefix_ids)], dtype=torch.long, device=device)
    return model(input_ids=prefix, use_cache=True).cache


def expand_cache(cache: Cache, rows: int) -> Cache:
    """A new cache holding the one row of `cache` (stock transformers layers, as `prefill`
    gives) `rows` times; `cache` itself is unchanged, so one prefix serves many batches."""
    expanded = copy.copy(cache)
    # Shallow layer copies suffice: repeating assigns fresh tensors to the copy's attributes.
    expanded.layers = [copy.copy(layer) for layer in cache.layers]
    expanded.batch_repeat_interleave(rows)
    return expanded


def continue_inputs(suffixes: Sequence[Sequence[int]], pad_id: int, cache: Cache | None,
                    prefix_mask: torch.Tensor) -> dict[str, Any]:
    """Model inputs that run row i's `suffixes[i]` after row i of `cache` (whose columns
    `prefix_mask` covers): the suffixes left-padded, so pads sit masked between prefix and
    suffix, and each row's positions continue from its count of attended prefix columns."""
    offsets = prefix_mask.sum(dim=1, keepdim=True).cpu()
    inputs: dict[str, Any] = left_pad(suffixes, pad_id, offset=offsets,
                                      device=prefix_mask.device)
    inputs["attention_mask"] = torch.cat([prefix_mask, inputs["attention_mask"]], dim=1)
    inputs["cache"] = cache
    return inputs


def cache_layers(cache: Cache) -> Layers | None:
    """Per layer, the (keys, values) `cache` holds; None unless every layer is a filled
    key/value layer (linear-attention state, for one, is not)."""
    layers = getattr(cache, "layers", None)
    if not layers or any(getattr(layer, "keys", None) is None for layer in layers):
        return None
    return [(layer.keys, layer.values) for layer in layers]


def cache_from_layers(layers: Layers, config: PretrainedConfig) -> DynamicCache:
    """A `DynamicCache` for `config`'s model holding `layers` (per layer, keys and values
    shaped [rows, heads, positions, head size]); the tensors given are not modified."""
    return DynamicCache(ddp_cache_data=layers, config=config)


def select_rows(cache: Cache, rows: Sequence[int], mask: torch.Tensor, *aligned: torch.Tensor
                ) -> list[torch.Tensor]:
    """Keep only `rows` of `cache` (in that order, in place) and return the same rows of its
    attention `mask` and of each `aligned` tensor; all rows in order change nothing."""
    tensors = [mask, *aligned]
    if list(rows) == list(range(mask.shape[0])):
        return tensors
    index = torch.tensor(list(rows), dtype=torch.long, device=mask.device)
    cache.batch_select_indices(index)
    return [tensor.index_select(0, index) for tensor in tensors]


def eos_token_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The ids that end a reply: the tokenizer's EOS and the generation config's, sorted."""
    ids = {tokenizer.eos_token_id}
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif generation_eos:
        ids.update(generation_eos)
    return sorted(i for i in ids if i is not None)


# ----- the continuously decoding batch's cache -----


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer over buffers that grow by doubling; `keys`/`values` are
    views of the filled part. A decode step writes its column in place, where the stock layer
    concatenates: it copies (and reallocates) the whole batch's cache at every token."""

    def __init__(self) -> None:
        super().__init__()
        self.length = 0
        self._key_buffer = torch.empty(0)
        self._value_buffer = torch.empty(0)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.replace(key_states, value_states)
            return self.keys, self.values
        added = key_states.shape[-2]
        if self.length + added > self._key_buffer.shape[-2]:
            self.replace(self.keys, self.values, room=added)
        self._key_buffer[..., self.length:self.length + added, :] = key_states
        self._value_buffer[..., self.length:self.length + added, :] = value_states
        self._expose(self.length + added)
        return self.keys, self.values

    def replace(self, keys: torch.Tensor, values: torch.Tensor, room: int = 0) -> None:
        """Hold exactly `keys`/`values`, in fresh buffers with space for `room` more tokens
        and as many again as are held (at least 64)."""
        length = keys.shape[-2]
        capacity = length + room + max(length, 64)
        self._key_buffer = keys.new_empty((*keys.shape[:-2], capacity, keys.shape[-1]))
        self._value_buffer = values.new_empty((*values.shape[:-2], capacity, values.shape[-1]))
        self._key_buffer[..., :length, :] = keys
        self._value_buffer[..., :length, :] = values
        self._expose(length)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.replace(self.keys[indices], self.values[indices])

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last `tokens_to_remove` positions (given as a negative number or as their
        count; transformers' layers take the negative one); the buffers keep their room."""
        self._expose(self.length - abs(tokens_to_remove))

    def _expose(self, length: int) -> None:
        self.length = length
        self.keys = self._key_buffer[..., :length, :]
        self.values = self._value_buffer[..., :length, :]


def growing_cache(config: PretrainedConfig, model: str) -> DynamicCache:
    """An empty cache of `GrowingLayer`s for `config`'s model (named `model` in errors); raises
    `ConfigError` unless every layer is a plain full-attention layer (the only kind that can be
    re-padded and joined)."""
    cache = DynamicCache(config=config)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise ConfigError(f"model {model!r} uses sliding-window or linear-attention layers; the "
                          "embedded server batches full-attention models only: serve it with "
                          "--engine vllm")
    cache.layers = [GrowingLayer() for _ in cache.layers]
    return cache


def make_growing(cache: Cache) -> None:
    """Turn `cache`'s filled stock full-attention layers into `GrowingLayer`s holding the same
    keys and values (copied once, into buffers with room), so a decode loop writes each new
    column in place; other layers are left as they are. Tensors taken from the cache before
    (a kept prompt's) are not changed by what it holds afterwards."""
    for index, layer in enumerate(getattr(cache, "layers", ())):
        if type(layer) is DynamicLayer and layer.is_initialized:
            grown = GrowingLayer()
            grown.update(layer.keys, layer.values)
            cache.layers[index] = grown


def is_growing(cache: Cache) -> bool:
    """Whether every layer of `cache` is a `GrowingLayer` (full attention, croppable in place)."""
    layers = getattr(cache, "layers", ())
    return bool(layers) and all(isinstance(layer, GrowingLayer) for layer in layers)


def join_rows(cache: DynamicCache, other: DynamicCache, mask: torch.Tensor,
              other_mask: torch.Tensor) -> torch.Tensor:
    """Append the rows of `other` to `cache` (both `growing_cache`s; in place), the shorter
    left-padded with masked zeros; returns the joint attention mask."""
    width = max(mask.shape[1], other_mask.shape[1])
    for mine, theirs in zip(cache.layers, other.layers, strict=True):
        mine.replace(torch.cat([_pad_columns(mine.keys, width), _pad_columns(theirs.keys, width)]),
                     torch.cat([_pad_columns(mine.values, width),
                                _pad_columns(theirs.values, width)]))
    return torch.cat([_pad_columns(mask, width), _pad_columns(other_mask, width)])


def join_all(caches: Sequence[DynamicCache], masks: Sequence[torch.Tensor]
             ) -> tuple[DynamicCache, torch.Tensor]:
    """The rows of every cache in `caches` (`growing_cache`s) in one cache, in order, each
    left-padded with masked zeros to the widest: one copy of each row, where joining them
    two at a time (`join_rows`) would copy the first rows once per join. Returns the first
    cache (changed in place) and the joint attention mask."""
    width = max(mask.shape[1] for mask in masks)
    first = caches[0]
    for index, layer in enumerate(first.layers):
        parts = [cache.layers[index] for cache in caches]
        layer.replace(torch.cat([_pad_columns(part.keys, width) for part in parts]),
                      torch.cat([_pad_columns(part.values, width) for part in parts]))
    return first, torch.cat([_pad_columns(mask, width) for mask in masks])


def drop_padding_columns(cache: DynamicCache, mask: torch.Tensor) -> torch.Tensor:
    """Drop the leading columns that are padding in every row from `cache` (a
    `growing_cache`; in place) and from `mask`; returns the trimmed mask."""
    first_used = int(mask.any(dim=0).int().argmax())
    if not first_used:
        return mask
    for layer in cache.layers:
        layer.replace(layer.keys[..., first_used:, :], layer.values[..., first_used:, :])
    return mask[:, first_used:]


def _pad_columns(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad the sequence axis (-2 for keys/values, -1 for a 2-D mask) with zeros."""
    axis = -1 if tensor.dim() == 2 else -2
    missing = width - tensor.shape[axis]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[axis] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=axis)
