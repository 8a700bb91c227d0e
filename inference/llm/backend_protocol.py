"""The one protocol every LLM backend implements, and the usage meter they all feed.

Three batched operations serve every agent in sieverag:

* `generate` — chat conversations in, text out (greedy unless told otherwise);
* `label_logprobs` — for each conversation, log P(label) of each given label string as the
  assistant's next output (e.g. "Yes"/"No"), tokenised as the model would emit it right after
  the chat template's assistant prefix;
* `continuation_logprob` — the summed token log-probability of a given assistant reply;
* `marked_label_logprobs` — log P(label) of each given single-token label read at every
  `LABEL_MARK` in a conversation (the next-token distribution after the text before the
  mark) and once more as the assistant's next output, all from one forward pass: how the
  one-pass filter reads each sentence's and its passage's verdict.

Before any of them runs, a backend passes its prompts through the one context guard
(`llm.context_guard.ContextGuard`): a prompt too long for the model is cut or refused, never run
past the context; the meter counts the cuts per agent.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import astuple, dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from sieverag.inference.core.settings import at_least, settings
from sieverag.inference.core.types import Conversation

Result = TypeVar("Result")


@settings
class GenerationSettings:
    """Decoding settings shared by all backends; also a run config's `generation:` section
    (the generator's answers; `--generation.max-new-tokens`)."""

    max_new_tokens: int = field(default=64, metadata={"help": "reply length cap in tokens"})
    temperature: float = field(default=0.0, metadata={
        "help": "sampling temperature; 0 decodes greedily (with `seed` for sampling)"})
    stop: tuple[str, ...] = field(default=(), metadata={
        "help": "strings that end a reply (not included in it)"})

    def __post_init__(self) -> None:
        at_least(1, max_new_tokens=self.max_new_tokens)
        at_least(0, temperature=self.temperature)


@dataclass
class Usage:
    """Counts for one agent: calls are prompts sent (a batch of 10 is 10 calls);
    `truncated_prompts` of them were cut to fit the model's context, losing `tokens_dropped`
    prompt tokens in all (inference/llm/context_guard.py); `seconds` is the wall time the agent's
    operations took (`metered`)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    truncated_prompts: int = 0
    tokens_dropped: int = 0
    seconds: float = 0.0

    def add(self, other: Usage) -> None:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.truncated_prompts += other.truncated_prompts
        self.tokens_dropped += other.tokens_dropped
        self.seconds += other.seconds

    def minus(self, earlier: Usage) -> Usage:
        """The counts added since `earlier` was this usage."""
        return Usage(*(now - before for now, before in zip(astuple(self), astuple(earlier),
                                                           strict=True)))


# One question's usage, by agent, while `question_usage()` is open in this context (a
# question's thread): every meter records into it too, so questions that share backends
# (`--concurrency`) keep their own counts.
_question_tally: contextvars.ContextVar[dict[str, Usage] | None] = contextvars.ContextVar(
    "sieverag_question_usage", default=None)
# While a call that serves several questions at once runs (`llm.call_batching`): whose rows its
# prompts are, in order, as (that question's tally, number of prompts).
_row_owners: contextvars.ContextVar[Sequence[tuple[dict[str, Usage] | None, int]] | None] = (
    contextvars.ContextVar("sieverag_row_owners", default=None))


@contextlib.contextmanager
def question_usage() -> Iterator[dict[str, Usage]]:
    """Collect, by agent, the usage every backend records in this context while it is open:
    one question's calls, tokens and seconds, however many questions share the backends."""
    tally: dict[str, Usage] = defaultdict(Usage)
    token = _question_tally.set(tally)
    try:
        yield tally
    finally:
        _question_tally.reset(token)


@contextlib.contextmanager
def rows_owned_by(owners: Sequence[tuple[dict[str, Usage] | None, int]]) -> Iterator[None]:
    """Within: the prompts of each backend call belong, in order, to these questions' tallies
    (`count` prompts each); `UsageMeter.record_rows` hands each its own rows' counts."""
    token = _row_owners.set(tuple(owners))
    try:
        yield
    finally:
        _row_owners.reset(token)


def measured(work: Callable[[], Result]) -> tuple[Result, dict[str, Usage], float]:
    """`work()`'s result, the usage it recorded (by agent, the agents that sent prompts) and
    its wall seconds: one question's, however many questions share the backends."""
    with question_usage() as usage:
        started = time.perf_counter()
        result = work()
        seconds = time.perf_counter() - started
    return result, {agent: u for agent, u in usage.items() if u.calls}, seconds


def current_question_usage() -> dict[str, Usage] | None:
    """The tally `question_usage()` opened in this context, if any."""
    return _question_tally.get()


def add_question_seconds(agent: str, seconds: float) -> None:
    """Add wall seconds to this context's question tally only (a batched call's wait)."""
    tally = _question_tally.get()
    if tally is not None:
        tally[agent].seconds += seconds


@dataclass
class UsageMeter:
    """Accumulates LLM usage by agent name (thread-safe); a run reads each question's share
    through `question_usage()`."""

    by_agent: dict[str, Usage] = field(default_factory=lambda: defaultdict(Usage))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, agent: str, calls: int, prompt_tokens: int, completion_tokens: int, *,
               truncated_prompts: int = 0, tokens_dropped: int = 0) -> None:
        """One call's counts in all (a backend that knows each prompt's counts calls
        `record_rows`, so that a call serving several questions gives each its own)."""
        self.record_rows(agent, [Usage(calls, prompt_tokens, completion_tokens,
                                       truncated_prompts, tokens_dropped)])

    def record_rows(self, agent: str, rows: Sequence[Usage]) -> None:
        """One call's counts, a row per prompt: the meter gets their sum, and each question its
        share (`rows_owned_by`, else this context's question all of them)."""
        owners = _row_owners.get()
        if owners is None:
            self._add(agent, [(_question_tally.get(), _summed(rows))])
        else:
            self._add(agent, _owned_shares(owners, rows))

    def _add(self, agent: str, shares: Sequence[tuple[dict[str, Usage] | None, Usage]]) -> None:
        with self._lock:
            for tally, usage in shares:
                self.by_agent[agent].add(usage)
                if tally is not None:
                    tally[agent].add(usage)

    def add_seconds(self, agent: str, seconds: float) -> None:
        with self._lock:
            self.by_agent[agent].seconds += seconds
        add_question_seconds(agent, seconds)

    def snapshot(self) -> dict[str, Usage]:
        with self._lock:
            return {name: Usage(*astuple(u)) for name, u in self.by_agent.items()}

    def since(self, earlier: dict[str, Usage]) -> dict[str, Usage]:
        """Usage recorded after `earlier` was taken, by agent (agents with no calls omitted)."""
        delta: dict[str, Usage] = {}
        for name, now in self.snapshot().items():
            diff = now.minus(earlier.get(name, Usage()))
            if diff.calls:
                delta[name] = diff
        return delta


def _owned_shares(owners: Sequence[tuple[dict[str, Usage] | None, int]], rows: Sequence[Usage]
                  ) -> list[tuple[dict[str, Usage] | None, Usage]]:
    """Each owner's part of a call's rows. Rows a prompt each, or k a prompt in prompt order
    (a label scored as k whole replies), go to the prompts' owners exactly; counts given for
    the whole call (one row) are shared out by the owners' prompts, the remainder to the
    first."""
    prompts = sum(count for _, count in owners)
    if prompts and len(rows) % prompts == 0:
        per_prompt, start, shares = len(rows) // prompts, 0, []
        for tally, count in owners:
            shares.append((tally, _summed(rows[start:start + count * per_prompt])))
            start += count * per_prompt
        return shares
    total = _summed(rows)
    fields = astuple(total)
    shares = [(tally, Usage(*(type(v)(v * count / prompts) for v in fields)))
              for tally, count in owners]
    rest = Usage(*(a - sum(astuple(u)[i] for _, u in shares) for i, a in enumerate(fields)))
    shares[0][1].add(rest)
    return shares


def _summed(rows: Sequence[Usage]) -> Usage:
    total = Usage()
    for row in rows:
        total.add(row)
    return total


Operation = TypeVar("Operation", bound=Callable[..., Any])
_metering = threading.local()  # set while a metered operation runs in this thread


def metered(operation: Operation) -> Operation:
    """Add each call's wall seconds to its agent's `Usage.seconds` in the backend's meter,
    when it returns (a refused or failed call, which records no usage, adds no seconds).
    Where one operation calls another (label_logprobs scoring a multi-token label through
    continuation_logprob), only the outer one counts, so no second is counted twice."""
    default_agent = inspect.signature(operation).parameters["agent"].default

    @functools.wraps(operation)
    def timed(self, *args, **kwargs):
        if getattr(_metering, "active", False):
            return operation(self, *args, **kwargs)
        _metering.active = True
        started = time.perf_counter()
        try:
            result = operation(self, *args, **kwargs)
        finally:
            _metering.active = False
        self.meter.add_seconds(kwargs.get("agent", default_agent), time.perf_counter() - started)
        return result

    return timed  # type: ignore[return-value]


# Where a prompt asks for a label mid-text (U+2063 INVISIBLE SEPARATOR, which no tokenizer
# is fed: `marked_prompt_ids` splits at it and the model never reads it).
LABEL_MARK = "\u2063"


def marked_prompt_ids(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    """The token ids the model reads for a chat-templated `text` holding `LABEL_MARK`s, and
    the position of the token each mark follows (the last token before it).

    The text between marks is tokenised piece by piece, so every mark falls on a token
    boundary and training, every backend and the server read the same ids; a mark at the
    very start of the text (no token before it) is an error."""
    pieces = text.split(LABEL_MARK)
    ids: list[int] = []
    positions: list[int] = []
    for number, piece in enumerate(pieces):
        ids.extend(tokenizer(piece, add_special_tokens=False)["input_ids"])
        if number < len(pieces) - 1:
            if not ids:
                raise ValueError("a label mark needs text before it")
            positions.append(len(ids) - 1)
    return ids, positions


def check_single_token_labels(labels: Sequence[str], token_ids: Sequence[Sequence[int]]) -> None:
    """Refuse labels that are not one token each (`marked_label_logprobs` reads one
    next-token step per mark), naming them."""
    long = [label for label, ids in zip(labels, token_ids, strict=True) if len(ids) != 1]
    if long:
        raise ValueError(f"marked_label_logprobs reads one token per label; {long!r} "
                         "tokenise to more than one")


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

    def marked_label_logprobs(
        self, prompts: Sequence[Conversation], labels: Sequence[str], *, agent: str = "scorer"
    ) -> list[list[dict[str, float]]]:
        """For each conversation: {label: log P(label)} at each `LABEL_MARK` in its text, in
        order, then one more as the assistant's next output (so len = marks + 1). Labels
        must be one token each. A prompt cut to fit the context keeps the marks before the
        cut only: its list is shorter, never misaligned."""
        ...


def check_labels(operation: str, labels: Sequence[str]) -> None:
    """Every backend's rule for the labels a scoring call reads: at least one, each a
    non-blank string (`ValueError` naming the operation)."""
    if not labels or any(not isinstance(label, str) or not label.strip() for label in labels):
        raise ValueError(f"{operation} needs labels that are non-blank strings, at least one, "
                         f"got {list(labels)!r}")


def check_continuations(prompts: Sequence[Conversation], continuations: Sequence[str]
                        ) -> None:
    """Every backend's rule for `continuation_logprob`: one continuation per prompt."""
    if len(prompts) != len(continuations):
        raise ValueError(f"continuation_logprob needs one continuation per prompt, got "
                         f"{len(continuations)} for {len(prompts)} prompts")


def chat_prompt_text(tokenizer: Any, conversation: Conversation) -> str:
    """The prompt a chat model reads for `conversation`: its chat template rendered as text,
    ending with the assistant prefix (every backend and the server render prompts so)."""
    return tokenizer.apply_chat_template(list(conversation), add_generation_prompt=True,
                                         tokenize=False)


def first_stop(text: str, stop: Sequence[str]) -> int | None:
    """Where the earliest of the `stop` strings starts in `text`, None when none occurs; an
    empty stop string stops nothing (every backend and the server cut replies by this)."""
    starts = [text.find(s) for s in stop if s and s in text]
    return min(starts) if starts else None


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """`text` up to its first stop string (servers differ on whether they include it)."""
    at = first_stop(text, stop)
    return text if at is None else text[:at]


def labels_as_replies(backend: LLMBackend, prompts: Sequence[Conversation],
                      labels: Sequence[str], *, agent: str) -> list[dict[str, float]]:
    """`label_logprobs` for labels of more than one token: each label scored as a whole
    reply (`continuation_logprob`), since one next-token step cannot read it."""
    scores = backend.continuation_logprob([p for p in prompts for _ in labels],
                                          list(labels) * len(prompts), agent=agent)
    return [dict(zip(labels, scores[i * len(labels):(i + 1) * len(labels)], strict=True))
            for i in range(len(prompts))]
