"""The context guard: every prompt a backend runs fits the model's context, or is refused.

A prompt fits when its tokens plus the tokens the call needs after it (a generate call's
`max_new_tokens`, a scored label, a scored continuation) are at most the model's context
length. A prompt that does not fit is handled as the backend's `context_overflow` says:

* `truncate` (the default): cut to fit. Only the inputs `prompt_templates.CUT_ORDER` names
  lose text — the retrieved text first (documents, document, evidence, context, chunk,
  sentences), then the memory notes — each from its end, at a token boundary, marked
  " …[truncated]"; inputs of one group lose tokens in proportion to their lengths. The
  question, the instruction, every other input and every message not rendered from a
  template (an assistant's reply) are kept whole. A prompt still too long with all of that
  text gone is refused.
* `error`: refused.

A refused prompt is one `ContextError` naming the model, the agent and the sizes, raised
before any of the call's prompts runs. Cutting is a pure function of the prompt, the room
left and the tokenizer: the same prompt is always cut the same way (the hf backend's prompt
cache matches later prompts on exact token prefixes). A prompt that fits is passed on as it
is, byte for byte.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sieverag.inference.core.errors import ConfigError, ContextError
from sieverag.inference.core.prompt_templates import CUT_ORDER, TemplateText
from sieverag.inference.core.types import ContextOverflow, Conversation

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TRUNCATION_MARKER = " …[truncated]"


def context_length_field() -> Any:
    """The `context_length` setting of a backend config (in-process, served, or either)."""
    return field(default=None, metadata={
        "help": "the context in tokens a prompt and what the call adds after it must fit "
                "(in-process, unset: the model's own; served, unset: not checked here, the "
                "server refuses a prompt too long; set, it needs chat_template_model)"})


def context_overflow_field() -> Any:
    """The `context_overflow` setting of a backend config (see this module's docstring)."""
    return field(default="truncate", metadata={
        "help": "a prompt over the context: truncate (cut its documents from their ends to "
                "fit) or error (refuse it)"})


def check_context_settings(context_length: int | None, overflow: str, *,
                           counts_tokens: bool = True, where: str = "",
                           error: type[Exception] = ConfigError) -> None:
    """The check every backend config makes of its context settings: `context_length` an
    integer >= 1 or None, `overflow` truncate or error, and a set length only where the
    tokens can be counted (`counts_tokens`; a served model needs chat_template_model)."""
    if context_length is not None and (isinstance(context_length, bool)
                                       or not isinstance(context_length, int)
                                       or context_length < 1):
        raise error(f"context_length must be an integer >= 1 or None, got {context_length!r}")
    if overflow not in ("truncate", "error"):
        raise error(f"context_overflow must be 'truncate' or 'error', got {overflow!r}")
    if context_length is not None and not counts_tokens:
        raise error(f"context_length{where} needs chat_template_model: the local tokenizer "
                    "folder of the served model, which counts a prompt's tokens")


@dataclass(frozen=True)
class FittedPrompt:
    """A prompt as it will run: its conversation, chat-templated text and token ids, and the
    prompt tokens cut from it to fit the context (0 when it fitted as it was)."""

    conversation: Conversation
    text: str
    ids: list[int]
    tokens_dropped: int = 0


@dataclass
class _Cut:
    """One cuttable input of one message: its full value, the end offset of each of its
    tokens (tokenised alone), how many of them are kept, and how often the message's
    template shows it."""

    message: int
    name: str
    value: str
    ends: list[int]
    occurrences: int
    kept: int = field(init=False)

    def __post_init__(self) -> None:
        self.kept = len(self.ends)

    def text(self) -> str:
        """The value as the prompt now shows it."""
        if self.kept == len(self.ends):
            return self.value
        if self.kept == 0:
            return TRUNCATION_MARKER.strip()
        return self.value[:self.ends[self.kept - 1]] + TRUNCATION_MARKER


class ContextGuard:
    """Fits prompts to one model's context (see the module docstring).

    `render` turns a conversation into the chat-templated text the model reads; `tokenizer`
    (a fast one: cuts use its token offsets) counts it."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, render: Callable[[Conversation], str],
                 context_length: int, overflow: ContextOverflow = "truncate",
                 model: str = "the model") -> None:
        self.tokenizer = tokenizer
        self.render = render
        self.context_length = context_length
        self.overflow = overflow
        self.model = model
        self._marker_tokens = len(self.encode(TRUNCATION_MARKER))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, which holds its own special tokens."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def holds(self, text: str) -> bool:
        """Whether `text` alone fits the context (a prompt holding it may still be cut: its
        question and instructions take room too)."""
        return len(self.encode(text)) <= self.context_length

    def fit(self, prompts: Sequence[Conversation], reserved: int | Sequence[int], *,
            agent: str, reserved_for: str = "new tokens") -> list[FittedPrompt]:
        """Each prompt as it will run, leaving `reserved` tokens (one number for every prompt,
        or one per prompt) of the context after it; `ContextError` if one cannot."""
        if isinstance(reserved, int):
            reserved = [reserved] * len(prompts)
        texts = [self.render(p) for p in prompts]
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        fitted = []
        for prompt, text, ids, reserve in zip(prompts, texts, encoded, reserved, strict=True):
            if len(ids) + reserve <= self.context_length:
                fitted.append(FittedPrompt(prompt, text, ids))
            else:
                fitted.append(self._cut(prompt, len(ids), reserve, agent, reserved_for))
        return fitted

    def _cut(self, prompt: Conversation, length: int, reserve: int, agent: str,
             reserved_for: str) -> FittedPrompt:
        """`prompt` (`length` tokens) with its documents cut until `reserve` tokens fit after
        it; `ContextError` where the setting or the prompt does not allow it."""
        sizes = (f"agent {agent!r} on {self.model}: the prompt is {length:,} tokens and the "
                 f"call needs {reserve:,} {reserved_for} after it, over the model's context "
                 f"of {self.context_length:,} tokens")
        if self.overflow == "error":
            raise ContextError(f"{sizes}; context_overflow is `error` (set it to `truncate` "
                               "to cut the prompt's documents to fit, or give fewer or "
                               "shorter documents)")
        budget = self.context_length - reserve
        cuts = self._cuts(prompt)
        conversation, text, ids = prompt, "", []
        for group in CUT_ORDER:
            in_group = [c for c in cuts if c.name in group]
            over = length - budget if not ids else len(ids) - budget
            while over > 0 and any(c.kept for c in in_group):
                # Cut a little more than the overflow: the markers of newly cut inputs.
                over += sum(self._marker_tokens * c.occurrences for c in in_group
                            if c.kept == len(c.ends))
                live = [c for c in in_group if c.kept]
                total = sum(c.kept * c.occurrences for c in live)
                for cut in live:
                    cut.kept -= min(cut.kept, max(1, math.ceil(over * cut.kept / total)))
                conversation = _with_cuts(prompt, cuts)
                text = self.render(conversation)
                ids = self.encode(text)
                over = len(ids) - budget
            if ids and over <= 0:
                return FittedPrompt(conversation, text, ids, length - len(ids))
        left = (f"; with its documents cut to nothing it is still {len(ids):,} tokens" if ids
                else "; it has no documents to cut")
        raise ContextError(f"{sizes}{left}: shorten the question, ask for fewer "
                           f"{reserved_for}, or use a model with a longer context")

    def _cuts(self, prompt: Conversation) -> list[_Cut]:
        """The cuttable inputs of every message rendered from a template, in message order."""
        names = frozenset().union(*CUT_ORDER)
        cuts = []
        for index, message in enumerate(prompt):
            content = message["content"]
            if not isinstance(content, TemplateText):
                continue
            fields = [f for _, f, _, _ in string.Formatter().parse(content.template) if f]
            for name in sorted(names & content.values.keys()):
                value = str(content.values[name])
                offsets = self.tokenizer(value, add_special_tokens=False,
                                         return_offsets_mapping=True)["offset_mapping"]
                cuts.append(_Cut(index, name, value, [end for _, end in offsets],
                                 fields.count(name)))
        return cuts


def _with_cuts(prompt: Conversation, cuts: Sequence[_Cut]) -> Conversation:
    """`prompt` with each cut input shown as cut (other messages are the same objects)."""
    changes: dict[int, dict[str, str]] = {}
    for cut in cuts:
        if cut.kept < len(cut.ends):
            changes.setdefault(cut.message, {})[cut.name] = cut.text()
    return [{**message, "content": message["content"].with_values(**changes[index])}
            if index in changes else message
            for index, message in enumerate(prompt)]


def context_guard_of(backend: object) -> ContextGuard | None:
    """The context guard `backend`'s prompts go through: an in-process model's, a served
    one's where `context_length` is set; None where prompts are not checked here."""
    return getattr(backend, "context_guard", None)
