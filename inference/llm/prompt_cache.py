"""The `hf` backend's prompt cache: the KV of the last `generate` call's prompts (and of its
greedy replies, each with its prompt, as far as decoded), kept so that a following call whose
prompts *extend* them (same tokens first, more after) computes only its new tokens.

MAIN-RAG's judge is the case it is made for: Agent-2's prompt continues Agent-1's
conversation (the document, the question, Agent-1's answer, then the evaluator's request), so
the document tokens Agent-1 just read, and the answer it just wrote, need not be read again
(where the answer's text tokenises back to the tokens written; else the prompt alone is
reused). This is what a server's
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
import torch.nn.functional as F
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

    def keep_rows(self, rows: Sequence[list[int]], layers: Sequence[kv.Layers],
                  masks: Sequence[torch.Tensor]) -> bool:
        """Keep rows gathered one by one (a decoded reply's prompt and the reply tokens fed so
        far: row i's ids, its per-layer (keys, values) shaped [1, heads, columns, head size]
        and its mask [1, columns]) as one batch, each left-padded to the widest with masked
        zeros: the shortest rows, as many as the token budget allows."""
        order = sorted(range(len(rows)), key=lambda i: masks[i].shape[1])
        room = self.max_tokens - self.kept_tokens
        count = 0
        while count < len(order) and (count + 1) * masks[order[count]].shape[1] <= room:
            count += 1
        chosen = order[:count]
        if not chosen:
            return False
        width = masks[chosen[-1]].shape[1]
        joined = [(torch.cat([_left_pad(layers[i][n][0], width) for i in chosen]),
                   torch.cat([_left_pad(layers[i][n][1], width) for i in chosen]))
                  for n in range(len(layers[chosen[0]]))]
        self.batches.append(KeptBatch(rows=[list(rows[i]) for i in chosen], layers=joined,
                                      mask=torch.cat([_left_pad(masks[i], width)
                                                      for i in chosen])))
        self.kept_tokens += width * len(chosen)
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


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """`tensor` with zero columns added before its columns (the axis before last of keys or
    values, the last of a 2-D mask) up to `width`."""
    missing = width - tensor.shape[-2 if tensor.dim() == 4 else -1]
    return F.pad(tensor, (0, 0, missing, 0) if tensor.dim() == 4 else (missing, 0))
