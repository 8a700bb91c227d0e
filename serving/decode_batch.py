"""Sequences that decode together: one left-padded KV cache and attention mask for all rows.

Continuous batching needs two operations the transformers cache does not offer: joining a
freshly prefilled group to the running batch (the shorter cache is left-padded with masked
zeros) and dropping finished rows (then trimming columns that are padding in every row).
Each row keeps its own position ids, so padding never shifts what a row computes.

The cache's layers are `GrowingLayer`s: keys and values live in buffers with spare room, and
a decode step writes its column in place. The stock layer concatenates instead, which copies
(and reallocates) the whole cache of the batch at every token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from sieverag.inference.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

Row = TypeVar("Row")


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer over buffers that grow by doubling; `keys`/`values` are
    views of the filled part."""

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

    def _expose(self, length: int) -> None:
        self.length = length
        self.keys = self._key_buffer[..., :length, :]
        self.values = self._value_buffer[..., :length, :]


def new_cache(config: PretrainedConfig, model: str) -> DynamicCache:
    """An empty cache of `GrowingLayer`s for `config`'s model; raises unless every layer is a
    plain full-attention layer (the only kind that can be re-padded and merged)."""
    cache = DynamicCache(config=config)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise ConfigError(f"model {model!r} uses sliding-window or linear-attention layers; the "
                          "embedded server batches full-attention models only: serve it with "
                          "--engine vllm")
    cache.layers = [GrowingLayer() for _ in cache.layers]
    return cache


class RunningBatch(Generic[Row]):
    """Rows (one per sequence) with the KV cache and attention mask they share."""

    def __init__(self, rows: list[Row], cache: DynamicCache, attention_mask: torch.Tensor) -> None:
        if len(rows) != attention_mask.shape[0]:
            raise ValueError(f"{len(rows)} rows but an attention mask of {attention_mask.shape[0]}")
        self.rows = rows
        self.cache = cache
        self.attention_mask = attention_mask

    def __len__(self) -> int:
        return len(self.rows)

    def extend(self, other: RunningBatch[Row]) -> None:
        """Append `other`'s rows; the shorter of the two caches is left-padded to match."""
        width = max(self.attention_mask.shape[1], other.attention_mask.shape[1])
        for mine, theirs in zip(self._layers(), other._layers(), strict=True):
            mine.replace(torch.cat([_pad_left(mine.keys, width), _pad_left(theirs.keys, width)]),
                         torch.cat([_pad_left(mine.values, width),
                                    _pad_left(theirs.values, width)]))
        self.attention_mask = torch.cat([_pad_left(self.attention_mask, width),
                                         _pad_left(other.attention_mask, width)])
        self.rows.extend(other.rows)

    def keep(self, indices: Sequence[int]) -> None:
        """Keep only the rows at `indices` (in that order), then drop all-padding columns."""
        if list(indices) == list(range(len(self.rows))):
            return
        index = torch.tensor(list(indices), dtype=torch.long, device=self.attention_mask.device)
        self.cache.batch_select_indices(index)
        self.attention_mask = self.attention_mask.index_select(0, index)
        self.rows = [self.rows[i] for i in indices]
        first_used = int(self.attention_mask.any(dim=0).int().argmax())
        if first_used:
            for layer in self._layers():
                layer.replace(layer.keys[..., first_used:, :], layer.values[..., first_used:, :])
            self.attention_mask = self.attention_mask[:, first_used:]

    def _layers(self) -> list[GrowingLayer]:
        return self.cache.layers  # made by `new_cache`

    def grow_mask(self) -> None:
        """One more attended column for every row: the token about to be fed."""
        ones = self.attention_mask.new_ones((len(self.rows), 1))
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=1)


def _pad_left(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad the sequence axis (-2 for keys/values, -1 for a 2-D mask) with zeros."""
    axis = -1 if tensor.dim() == 2 else -2
    missing = width - tensor.shape[axis]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[axis] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=axis)
