"""AMU, Amber's agent-based memory updater (arXiv 2504.05312).

The memory is plain text: short notes of what has been found for the question, at most
`max_chars` characters. Each round with new filtered evidence runs three agents, one after
the other as the paper describes them:

* Reviewer — is the proposed update (the new evidence) correct and relevant to the question?
* Challenger — reads the review: what is still missing, wrong or overlooked among the
  question's conditions?
* Refiner — writes the revised memory from the old memory, the evidence and both verdicts.

The three agents are one conversation: the Reviewer's prompt (question, memory, new
evidence), its check as the assistant's turn, the Challenger's request, its objection, the
Refiner's request. Each agent's prompt extends the one before, so the `hf` backend's prompt
cache (and a server's prefix cache) reads the evidence once, not three times. All memory and
collector prompts share one system prompt.

An empty Refiner reply leaves the memory unchanged; a reply over the cap is cut at the last
sentence end (or word break) before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sieverag.inference.core.prompt_templates import load_template
from sieverag.inference.core.settings import at_least, settings
from sieverag.inference.llm.backend_protocol import GenerationSettings, LLMBackend

EMPTY_MEMORY = "(empty)"
REVIEW_AGENT = "reviewer"
CHALLENGE_AGENT = "challenger"
REFINE_AGENT = "refiner"


@settings
class MemoryConfig:
    """Settings of the memory updater (AMU)."""

    max_chars: int = field(default=1200, metadata={"help": "memory length cap in characters"})
    review_max_new_tokens: int = field(default=64, metadata={
        "help": "length cap of the Reviewer's and the Challenger's replies"})
    refine_max_new_tokens: int = field(default=160, metadata={
        "help": "length cap of the Refiner's reply (the new memory)"})

    def __post_init__(self) -> None:
        at_least(1, "amber.memory.", max_chars=self.max_chars,
                 review_max_new_tokens=self.review_max_new_tokens,
                 refine_max_new_tokens=self.refine_max_new_tokens)


@dataclass(frozen=True)
class MemoryUpdate:
    """One round of the updater: the three agents' replies and the memory they produced."""

    review: str
    challenge: str
    refined: str
    memory: str
    truncated: bool

    def to_dict(self) -> dict:
        return {"reviewer": self.review, "challenger": self.challenge, "refiner": self.refined,
                "truncated": self.truncated}


def shown_memory(memory: str) -> str:
    """The memory as prompts show it ("(empty)" before anything is known)."""
    return memory or EMPTY_MEMORY


def cap_memory(text: str, max_chars: int) -> tuple[str, bool]:
    """`text` cut to at most `max_chars` at the last sentence end (else word break) before
    the cap; returns (text, whether it was cut)."""
    text = text.strip()
    if len(text) <= max_chars:
        return text, False
    head = text[:max_chars]
    cut = max(head.rfind(". "), head.rfind("\n"))
    if cut > 0:
        return head[:cut + 1].strip(), True
    space = head.rfind(" ")
    return (head[:space] if space > 0 else head).strip(), True


class MemoryUpdater:
    """The AMU: Reviewer, then Challenger (who reads the review), then Refiner, on one
    backend."""

    def __init__(self, backend: LLMBackend, config: MemoryConfig | None = None) -> None:
        self.backend = backend
        self.config = config if config is not None else MemoryConfig()
        self.reviewer = load_template("amu_reviewer")
        self.challenger = load_template("amu_challenger")
        self.refiner = load_template("amu_refiner")

    def update(self, question: str, memory: str, evidence: str) -> MemoryUpdate:
        """The memory revised with `evidence` (the round's newly kept documents, as text)."""
        shared = {"question": question, "memory": shown_memory(memory), "evidence": evidence}
        review_settings = GenerationSettings(max_new_tokens=self.config.review_max_new_tokens)
        conversation = self.reviewer.messages(**shared)
        review = self.backend.generate([conversation], review_settings,
                                       agent=REVIEW_AGENT)[0].strip()
        conversation = [*conversation, {"role": "assistant", "content": review or "none"},
                        *self.challenger.messages()]
        challenge = self.backend.generate([conversation], review_settings,
                                          agent=CHALLENGE_AGENT)[0].strip()
        conversation = [*conversation, {"role": "assistant", "content": challenge or "none"},
                        *self.refiner.messages()]
        refine_settings = GenerationSettings(max_new_tokens=self.config.refine_max_new_tokens)
        refined = self.backend.generate([conversation], refine_settings,
                                        agent=REFINE_AGENT)[0].strip()
        if not refined:
            return MemoryUpdate(review, challenge, refined, memory, False)
        new_memory, truncated = cap_memory(refined, self.config.max_chars)
        return MemoryUpdate(review, challenge, refined, new_memory, truncated)
