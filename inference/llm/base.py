"""The one protocol every LLM backend implements, and the usage meter they all feed.

Three batched operations serve every agent in sieverag:

* `generate` — chat conversations in, text out (greedy unless told otherwise);
* `label_logprobs` — for each conversation, log P(label) of each given label string as the
  assistant's next output (e.g. "Yes"/"No"), tokenised as the model would emit it right after
  the chat template's assistant prefix;
* `continuation_logprob` — the summed token log-probability of a given assistant reply.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from sieverag.inference.types import Conversation


@dataclass(frozen=True)
class GenerationSettings:
    """Decoding settings shared by all backends."""

    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 means greedy decoding
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")


@dataclass
class Usage:
    """Counts for one agent: calls are prompts sent (a batch of 10 is 10 calls)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens


@dataclass
class UsageMeter:
    """Accumulates LLM usage by agent name; pipelines diff snapshots per question."""

    by_agent: dict[str, Usage] = field(default_factory=lambda: defaultdict(Usage))

    def record(self, agent: str, calls: int, prompt_tokens: int, completion_tokens: int) -> None:
        self.by_agent[agent].add(Usage(calls, prompt_tokens, completion_tokens))

    def snapshot(self) -> dict[str, Usage]:
        return {name: Usage(u.calls, u.prompt_tokens, u.completion_tokens)
                for name, u in self.by_agent.items()}

    def since(self, earlier: dict[str, Usage]) -> dict[str, Usage]:
        """Usage recorded after `earlier` was taken, by agent (agents with no calls omitted)."""
        delta: dict[str, Usage] = {}
        for name, now in self.by_agent.items():
            before = earlier.get(name, Usage())
            diff = Usage(now.calls - before.calls, now.prompt_tokens - before.prompt_tokens,
                         now.completion_tokens - before.completion_tokens)
            if diff.calls:
                delta[name] = diff
        return delta


@runtime_checkable
class LLMBackend(Protocol):
    """What every agent needs from a language model. All operations are batched."""

    meter: UsageMeter

    @property
    def model_name(self) -> str: ...

    def generate(
        self,
        prompts: Sequence[Conversation],
        settings: GenerationSettings = GenerationSettings(),
        *,
        agent: str = "generator",
    ) -> list[str]:
        """One reply per conversation, in order, with stop strings cut off."""
        ...

    def label_logprobs(
        self, prompts: Sequence[Conversation], labels: Sequence[str], *, agent: str = "scorer"
    ) -> list[dict[str, float]]:
        """For each conversation, {label: log P(label as the assistant's next output)}."""
        ...

    def continuation_logprob(
        self, prompts: Sequence[Conversation], continuations: Sequence[str], *,
        agent: str = "scorer",
    ) -> list[float]:
        """For each (conversation, reply) pair, the summed log-prob of the reply's tokens."""
        ...
