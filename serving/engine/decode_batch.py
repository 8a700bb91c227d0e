"""Sequences that decode together: one left-padded KV cache and attention mask for all rows.

Continuous batching joins a freshly prefilled group to the running batch (the shorter cache
left-padded with masked zeros) and drops finished rows (then trims columns that are padding
in every row); the cache operations live in `sieverag.inference.llm.kv`, on its
`growing_cache`, whose decode steps write in place. Each row keeps its own position ids, so
padding never shifts what a row computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

import torch
from transformers import DynamicCache

from sieverag.inference.llm import kv

Row = TypeVar("Row")


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
        self.attention_mask = kv.join_rows(self.cache, other.cache, self.attention_mask,
                                           other.attention_mask)
        self.rows.extend(other.rows)

    def keep(self, indices: Sequence[int]) -> None:
        """Keep only the rows at `indices` (in that order), then drop all-padding columns."""
        if list(indices) == list(range(len(self.rows))):
            return
        (mask,) = kv.select_rows(self.cache, indices, self.attention_mask)
        self.attention_mask = kv.drop_padding_columns(self.cache, mask)
        self.rows = [self.rows[i] for i in indices]

    def grow_mask(self) -> None:
        """One more attended column for every row: the token about to be fed."""
        ones = self.attention_mask.new_ones((len(self.rows), 1))
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=1)
