"""Sequences that decode together: one left-padded KV cache and attention mask for all rows.

Continuous batching needs two operations the transformers cache does not offer: joining a
freshly prefilled group to the running batch (the shorter cache is left-padded with masked
zeros) and dropping finished rows (then trimming columns that are padding in every row).
Each row keeps its own position ids, so padding never shifts what a row computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from inference.errors import ConfigError

Row = TypeVar("Row")


def check_batchable(cache: DynamicCache, model: str) -> None:
    """Raise unless every cache layer is a plain full-attention layer (which we can re-pad)."""
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise ConfigError(f"model {model!r} uses sliding-window or linear-attention layers; the "
                          "embedded server batches full-attention models only: serve it with "
                          "--engine vllm")


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
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, width), _pad_left(theirs.keys, width)])
            mine.values = torch.cat([_pad_left(mine.values, width),
                                     _pad_left(theirs.values, width)])
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
            for layer in self.cache.layers:
                layer.keys = layer.keys[..., first_used:, :]
                layer.values = layer.values[..., first_used:, :]
            self.attention_mask = self.attention_mask[:, first_used:]

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
