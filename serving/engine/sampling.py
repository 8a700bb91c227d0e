"""Choosing each row's next token: greedy at temperature 0, else temperature + top-p sampling.

Reported log-probs are always the model's own (before temperature and top-p), as vLLM's
default `raw_logprobs` mode reports them, so scores do not depend on sampling settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """How one sequence picks tokens; `generator` is set for seeded requests."""

    temperature: float = 0.0
    top_p: float = 1.0
    generator: torch.Generator | None = None


def choose_tokens(logprobs: torch.Tensor, samplings: Sequence[Sampling]) -> list[int]:
    """One token per row of `logprobs` ([rows, vocab] log-softmax output)."""
    chosen = logprobs.argmax(dim=-1).tolist()
    for row, sampling in enumerate(samplings):
        if sampling.temperature > 0:
            chosen[row] = _sample(logprobs[row], sampling)
    return chosen


def _sample(logprobs: torch.Tensor, sampling: Sampling) -> int:
    probs = torch.softmax(logprobs / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep the smallest set of most likely tokens whose mass reaches top_p (at least one).
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= sampling.top_p
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=sampling.generator))
