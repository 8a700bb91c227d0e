"""The `hf` backend's prompt cache: the KV of the last `generate` call's prompts, kept so that a
following call whose prompts *extend* them (same tokens first, more after) computes only its
new tokens.

MAIN-RAG's judge is the case it is made for: Agent-2's prompt continues Agent-1's
conversation (the document, the question, Agent-1's answer, then the evaluator's request), so
the document tokens Agent-1 just read need not be read again. This is what a server's
automatic prefix cache (vLLM's) does for the `openai` backend; here it is explicit and small:
only the last call's prompts, and only up to `max_tokens` cached positions (padding
included), the rest simply not kept.

A kept batch stays in the left-padded layout `generate` ran it in: per layer the keys and
values of the prompt columns, with their attention mask. A continuation selects its rows,
appends its own tokens after the stored columns (left-padded, pads masked out) and continues
each row's positions from that row's prompt length, so scores agree with the uncached
forward pass to float rounding (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from sieverag.inference.llm import kv


@dataclass
class KeptBatch:
    """One generate batch's prompts: their ids, per-layer (keys, values) of the prompt columns,
    and the prompt columns' attention mask."""

    rows: list[list[int]]
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    mask: torch.Tensor

    def select(self, rows: Sequence[int], config) -> tuple[DynamicCache, torch.Tensor]:
        """A fresh cache (and mask) holding only `rows`, in that order; the kept tensors are
        not modified (a forward pass concatenates onto new ones)."""
        cache = kv.cache_from_layers(self.layers, config)
        (mask,) = kv.select_rows(cache, rows, self.mask)
        return cache, mask


class PromptCache:
    """The prompts of the last generate call, looked up by token prefix."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.batches: list[KeptBatch] = []
        self.kept_tokens = 0
        self.reused_tokens = 0  # prompt tokens not recomputed thanks to the cache, all calls

    def clear(self) -> None:
        self.batches, self.kept_tokens = [], 0

    def keep(self, rows: Sequence[list[int]], cache, mask: torch.Tensor) -> bool:
        """Keep a generate batch's prompt columns (the first `mask.shape[1]` positions of
        `cache`) if the token budget allows and the cache is a plain per-layer KV cache."""
        width = mask.shape[1]
        if self.kept_tokens + width * len(rows) > self.max_tokens:
            return False
        layers = kv.cache_layers(cache)
        if layers is None:
            return False
        self.batches.append(KeptBatch(
            rows=[list(r) for r in rows],
            layers=[(keys[:, :, :width], values[:, :, :width]) for keys, values in layers],
            mask=mask))
        self.kept_tokens += width * len(rows)
        return True

    def lookup(self, sequences: Sequence[list[int]]) -> dict[int, tuple[int, int]]:
        """For each sequence that strictly extends a kept prompt: index → (batch, row) of the
        longest such prompt."""
        found: dict[int, tuple[int, int]] = {}
        if not self.batches:
            return found
        kept = {}
        for b, batch in enumerate(self.batches):
            for r, row in enumerate(batch.rows):
                kept.setdefault(tuple(row), (b, r))
        lengths = sorted({len(row) for batch in self.batches for row in batch.rows}, reverse=True)
        for i, sequence in enumerate(sequences):
            for length in lengths:
                if length < len(sequence) and tuple(sequence[:length]) in kept:
                    found[i] = kept[tuple(sequence[:length])]
                    break
        return found
