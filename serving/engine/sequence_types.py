"""What the batching engine takes and gives for one sequence: the request (`SequenceRequest`),
each token as it is chosen (`TokenEvent` with its `TokenLogprob`, for a streamed request's
listener) and the finished result (`SequenceResult`); `EngineClosedError` when the engine
stops before a sequence finishes.

The HTTP endpoints build the requests and read the results;
`continuous_batching.BatchingEngine` runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length"]


class EngineClosedError(RuntimeError):
    """The engine was shut down before the request finished."""


@dataclass(frozen=True)
class SequenceRequest:
    """One prompt to continue; `model` is a served name (the base or an adapter)."""

    model: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    top_logprobs: int = 0  # alternatives reported per token (the chosen one is always reported)
    prompt_logprobs: bool = False  # also score the prompt's tokens (for echo)
    stop: tuple[str, ...] = ()
    # Tokens whose log-probs at the first new position are reported (a Yes/No verdict read
    # in one step, as `label_logprobs` reads it); with max_tokens=0 nothing is generated.
    label_token_ids: tuple[int, ...] = ()
    # Prompt positions (in order) after which those tokens' log-probs are reported too: the
    # next-token distribution at each, as `marked_label_logprobs` reads a verdict at every
    # mark. Read from the logits the prompt log-probs' pass computes, so it needs them.
    label_positions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("prompt_ids must hold at least one token")
        if self.max_tokens < 0 or self.top_logprobs < 0:
            raise ValueError(f"max_tokens and top_logprobs must be >= 0, got "
                             f"{self.max_tokens} and {self.top_logprobs}")
        if self.label_positions:
            if not (self.prompt_logprobs and self.label_token_ids):
                raise ValueError("label_positions needs prompt_logprobs and label_token_ids")
            positions = self.label_positions
            if (list(positions) != sorted(positions) or positions[0] < 0
                    or positions[-1] >= len(self.prompt_ids)):
                raise ValueError(f"label_positions must be in order, within the prompt's "
                                 f"{len(self.prompt_ids)} tokens, got {self.label_positions}")


@dataclass(frozen=True)
class TokenLogprob:
    """A token, its log-prob, and the most likely alternatives at its position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TokenEvent:
    """A token just chosen for a streamed sequence, as its listener gets it.

    `last`: the sequence finished with this token (its text may then be cut by a stop string:
    the final text is the `SequenceResult`'s). `prompt_logprobs`: the prompt's log-probs when
    the request asked for them (set from the first token on)."""

    token: TokenLogprob
    last: bool
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None


# Called on the engine's worker thread, once per token: it must be quick and must not raise.
TokenListener = Callable[[TokenEvent], None]


@dataclass(frozen=True)
class SequenceResult:
    """Generated tokens (an EOS included), text (stop strings and EOS cut off), log-probs.

    `prompt_logprobs` is set when asked for: one entry per prompt token, the first None.
    `label_logprobs` holds the log-prob of each of the request's `label_token_ids` as the
    first new token, in their order; `marked_label_logprobs` the same at each of its
    `label_positions`, one tuple per position.
    """

    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason
    logprobs: tuple[TokenLogprob, ...]
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None
    label_logprobs: tuple[float, ...] = ()
    marked_label_logprobs: tuple[tuple[float, ...], ...] = ()
