"""The records every part of sieverag passes around: documents, examples, chat messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypedDict


class ChatMessage(TypedDict):
    role: Literal["system", "user", "assistant"]
    content: str


Conversation = list[ChatMessage]

# Where and in what precision an in-process model runs ("auto": cuda and bf16 when available).
Device = Literal["auto", "cpu", "cuda"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
# What a backend does with a prompt longer than the model's context (inference/llm/context.py).
ContextOverflow = Literal["truncate", "error"]


@dataclass(frozen=True)
class Document:
    """One retrieved or given chunk of text.

    `is_gold` is None where the data does not say; `sentences` holds the data's own sentence
    split where it has one, and `supporting_sentences` the indices of its gold key sentences.
    """

    id: str
    text: str
    title: str = ""
    is_gold: bool | None = None
    sentences: tuple[str, ...] | None = None
    supporting_sentences: tuple[int, ...] | None = None

    def as_context(self) -> str:
        """The text a model reads: title line (if any) then the body."""
        return f"{self.title}\n{self.text}" if self.title else self.text


@dataclass(frozen=True)
class Example:
    """One question with its gold answers and (optionally) its documents.

    Multiple-choice examples carry `choices` (label → text) and `answer_key`.
    """

    id: str
    question: str
    answers: tuple[str, ...]
    documents: tuple[Document, ...] = ()
    choices: dict[str, str] | None = None
    answer_key: str | None = None
    metadata: dict = field(default_factory=dict)

    @property
    def has_gold_documents(self) -> bool:
        return any(d.is_gold is not None for d in self.documents)
