"""A scripted LLMBackend for testing agents and pipelines without a model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sieverag.inference.core.types import Conversation
from sieverag.inference.llm.backend_protocol import LABEL_MARK, GenerationSettings, UsageMeter


def user_text(conversation: Conversation) -> str:
    return "\n\n".join(m["content"] for m in conversation if m["role"] == "user")


class ScriptedBackend:
    """Replies and label scores come from functions of the prompt's user text (every user
    message, joined: a follow-up turn such as the judge's carries the first one's document)."""

    def __init__(self, reply: Callable[[str], str] = lambda text: "answer",
                 labels: Callable[[str], dict[str, float]] | None = None) -> None:
        self.reply = reply
        self.labels = labels or (lambda text: {})
        self.meter = UsageMeter()
        self.calls: list[tuple[str, str]] = []

    @property
    def model_name(self) -> str:
        return "scripted"

    def generate(self, prompts: Sequence[Conversation],
                 settings: GenerationSettings = GenerationSettings(), *,
                 agent: str = "generator") -> list[str]:
        self.meter.record(agent, len(prompts), 10 * len(prompts), 2 * len(prompts))
        self.calls += [(agent, user_text(p)) for p in prompts]
        return [self.reply(user_text(p)) for p in prompts]

    def label_logprobs(self, prompts: Sequence[Conversation], labels: Sequence[str], *,
                       agent: str = "scorer") -> list[dict[str, float]]:
        self.meter.record(agent, len(prompts), 10 * len(prompts), 0)
        self.calls += [(agent, user_text(p)) for p in prompts]
        return [{label: self.labels(user_text(p)).get(label, -20.0) for label in labels}
                for p in prompts]

    def marked_label_logprobs(self, prompts: Sequence[Conversation], labels: Sequence[str], *,
                              agent: str = "scorer") -> list[list[dict[str, float]]]:
        """`label_logprobs`'s scores at every mark and for the reply (marks + 1 reads)."""
        scores = self.label_logprobs(prompts, labels, agent=agent)
        return [[dict(score) for _ in range(sum(m["content"].count(LABEL_MARK) for m in p) + 1)]
                for p, score in zip(prompts, scores, strict=True)]

    def continuation_logprob(self, prompts: Sequence[Conversation], continuations: Sequence[str],
                             *, agent: str = "scorer") -> list[float]:
        self.meter.record(agent, len(prompts), 10 * len(prompts), 0)
        return [-float(len(c)) for c in continuations]


def serve_every_role(monkeypatch, backend: object) -> None:
    """Composition builds `backend` for every role a run calls, and for its grader where the
    plan names one (no model loads)."""
    from sieverag.inference.composition import compose

    def build_roles(plan, batcher=None):
        served = batcher.wrap(backend) if batcher is not None else backend
        return compose.Roles(**dict.fromkeys(plan.role_specs, served),
                             grader=served if plan.grader is not None else None)

    monkeypatch.setattr(compose, "build_roles", build_roles)


def scripted_filter_folder(monkeypatch, folder, train_questions: list[list[str]],
                           backend: object) -> None:
    """`sieverag filter` commands find a filter in `folder` (created here), its card naming
    `train_questions` (source, question) as its training questions, and run it on `backend`."""
    from sieverag.inference.filters import adapter_store
    from sieverag.inference.filters.card import card_file
    from sieverag.inference.llm import backend_registry

    folder.mkdir()
    card = {"base_model": "scripted", "dataset": {"train_questions": train_questions}}
    monkeypatch.setattr(adapter_store, "find_adapter", lambda name: type("Found", (), {
        "path": folder})())
    monkeypatch.setattr(card_file, "read_card", lambda path: card)
    monkeypatch.setattr(adapter_store, "resolve_filter", lambda path, base: folder)
    monkeypatch.setattr(backend_registry, "build_backend", lambda spec: backend)
