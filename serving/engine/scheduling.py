"""The batching engine's order of work: whose sequences start next, and which prefill together.

Sequences not started wait by owner (an owner is one HTTP request: all the filter windows of
a rerank request, all the prompts of a completions request). `OwnerTurns` takes them one of
each owner in a round, round after round, within a step's prompt-token budget, so a small
request sent while a large one's windows wait runs in the next step. `prefill_chunks` packs
one model's new sequences into prefill passes of similar length within the budget, and
`slice_positions` says how many prompt positions a pass computes at a time.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, Protocol, TypeVar

import torch

from sieverag.serving.engine.sequence_types import SequenceRequest

# Prompt tokens per prefill pass, and logits kept per forward step for prompt log-probs
# (rows x positions x vocabulary floats). A prompt longer than PROMPT_SLICE is run through the
# model PROMPT_SLICE positions at a time (its cache growing), so one prefill's attention
# scores and logits stay bounded however long the prompt: an 8k-token echo request no longer
# holds 8k x vocabulary logits and 8k x 8k attention scores at once. Prefill is compute-bound
# on CPU (~1.6 ms a token for SmolLM2-135M on 2 cores), so a full pass takes seconds; a pass
# whose every sequence is cancelled stops at its next decoder layer (batching's
# `_AbandonCheck`)
# rather than run to its end. Smaller passes would bound that work too, but cost throughput:
# the 1,000-request load ran 4.07 requests/s with 256-token passes against 4.87 with 2,048.
PREFILL_TOKEN_BUDGET = 2048
# On CPU a step's time grows with its tokens, so a short request waits for the step under way
# in proportion to it: a quarter of the GPU budget, about two filter windows (one a step when
# two owners share it), holds that wait to a window's time.
CPU_PREFILL_TOKEN_BUDGET = 512
# On CPU a prefill pass also yields to other requests' new sequences every this many
# positions: a short request waits for one such slice of a long prompt.
CPU_PROMPT_SLICE = 128
PROMPT_LOGITS_BUDGET = 1 << 26
PROMPT_SLICE = 512


class Queued(Protocol):
    """A sequence as scheduling sees it: its request, and whose turn it waits for (None: its
    own)."""

    request: SequenceRequest
    owner: Hashable | None


Q = TypeVar("Q", bound=Queued)


def owner_of(sequence: Queued) -> Hashable:
    """Whose turn `sequence` waits for: its owner, or itself."""
    return sequence if sequence.owner is None else sequence.owner


def by_model(sequences: list[Q]) -> dict[str, list[Q]]:
    """`sequences` grouped by the served model name they ask for, in order."""
    groups: dict[str, list[Q]] = defaultdict(list)
    for sequence in sequences:
        groups[sequence.request.model].append(sequence)
    return groups


def slice_positions(device: torch.device) -> int:
    """Positions a prefill pass computes at a time: PROMPT_SLICE, and on CPU (where a
    slice's time grows with its tokens) at most CPU_PROMPT_SLICE."""
    if device.type == "cuda":
        return PROMPT_SLICE
    return min(PROMPT_SLICE, CPU_PROMPT_SLICE)


class OwnerTurns(Generic[Q]):
    """Sequences not started, by owner, in the order the owners take their turns (a new owner
    after the others; an owner served goes to the back)."""

    def __init__(self) -> None:
        self._waiting: dict[Hashable, deque[Q]] = {}

    def __len__(self) -> int:
        """Sequences waiting, of every owner."""
        return sum(map(len, self._waiting.values()))

    def __iter__(self) -> Iterator[Hashable]:
        """The owners waiting, in turn order."""
        return iter(list(self._waiting))

    def add(self, sequence: Q) -> None:
        """Queue `sequence` behind its owner's."""
        self._waiting.setdefault(owner_of(sequence), deque()).append(sequence)

    def keep(self, wanted: Callable[[list[Q]], list[int]]) -> None:
        """Keep of each owner's sequences those at the indices `wanted` gives (the others
        leave; an owner left with none leaves the turn order)."""
        for owner, waiting in list(self._waiting.items()):
            kept = deque(waiting[i] for i in wanted(list(waiting)))
            if kept:
                self._waiting[owner] = kept
            else:
                del self._waiting[owner]

    def clear(self) -> None:
        self._waiting.clear()

    def take(self, room: int, max_tokens: int, owners: set[Hashable] | None = None) -> list[Q]:
        """Up to `room` waiting sequences (of `owners` only, where given), one of each owner
        in a round, round after round, until their prompts pass `max_tokens` (the first is
        taken whatever its length); an owner served goes to the back of the turn order."""
        taken: list[Q] = []
        tokens = 0
        while len(taken) < room and any(owners is None or o in owners for o in self._waiting):
            for owner in list(self._waiting):
                if owners is not None and owner not in owners:
                    continue
                waiting = self._waiting[owner]
                size = len(waiting[0].request.prompt_ids)
                if taken and tokens + size > max_tokens:
                    return taken
                taken.append(waiting.popleft())
                tokens += size
                del self._waiting[owner]
                if waiting:
                    self._waiting[owner] = waiting
                if len(taken) == room:
                    break
        return taken


def prefill_chunks(group: list[Q], max_rows: int, vocab_size: int,
                   token_budget: int = PREFILL_TOKEN_BUDGET) -> list[list[Q]]:
    """Split one model's new sequences into prefill passes of similar length within
    `token_budget` padded tokens, shortest first.

    Sequences that need prompt log-probs (every position's logits, one slice at a time) go in
    passes of their own.
    """
    chunks: list[list[Q]] = []
    ordered = sorted(group, key=lambda s: (s.request.prompt_logprobs, len(s.request.prompt_ids)))
    for sequence in ordered:
        echo = sequence.request.prompt_logprobs
        if chunks and chunks[-1][0].request.prompt_logprobs == echo:
            rows, width = len(chunks[-1]) + 1, len(sequence.request.prompt_ids)  # the widest
            fits = rows <= max_rows and rows * width <= token_budget
            if echo:
                logits = rows * min(width, PROMPT_SLICE) * vocab_size
                fits = fits and logits <= PROMPT_LOGITS_BUDGET
            if fits:
                chunks[-1].append(sequence)
                continue
        chunks.append([sequence])
    return chunks
