"""The records every part of sieverag passes around: documents, examples, chat messages,
rerank results."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypedDict

from pydantic import AfterValidator, FiniteFloat, StrictBool, StrictInt, StrictStr, TypeAdapter
from pydantic.dataclasses import dataclass as pydantic_dataclass


class ChatMessage(TypedDict):
    role: Literal["system", "user", "assistant"]
    content: str


Conversation = list[ChatMessage]

_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
DEVICE_CHOICES = "auto, cpu, cuda or cuda:N (the GPU of index N)"


def check_device(value: str) -> str:
    """`value` if it names a device an in-process model can run on (`DEVICE_CHOICES`), else
    ValueError saying what it may be; says nothing of whether this machine has that GPU
    (`check_device_present`)."""
    if not isinstance(value, str) or not _DEVICE.fullmatch(value):
        raise ValueError(f"a device is {DEVICE_CHOICES}, got {value!r}")
    return value


# Where an in-process model runs: "auto" (cuda:0 when a GPU is present, else cpu), "cpu",
# "cuda" (the current GPU) or "cuda:N"; each role has its own (`models.filter.device cuda:1`).
Device = Annotated[str, AfterValidator(check_device)]
DType = Literal["auto", "float32", "bfloat16", "float16"]
# What a backend does with a prompt longer than the model's context
# (inference/llm/context_guard.py).
ContextOverflow = Literal["truncate", "error"]


def check_device_present(device: str, setting: str = "device") -> str:
    """`device` (`check_device`) as torch names it, once this machine is known to have it:
    "auto" becomes cuda:0 or cpu, "cuda" the current GPU. A GPU this machine lacks is one
    ConfigError naming `setting` (e.g. `models.filter.device`) and the GPUs there are."""
    from sieverag.inference.core.errors import ConfigError

    try:
        check_device(device)
    except ValueError as error:
        raise ConfigError(f"{setting}: {error}") from None
    if device == "cpu":
        return device
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device == "auto":
        return "cuda:0" if count else "cpu"
    index = int(device.partition(":")[2] or (torch.cuda.current_device() if count else 0))
    if index >= count:
        present = (f"{count} CUDA GPU{'s' if count > 1 else ''} (cuda:0"
                   f"{f' to cuda:{count - 1}' if count > 1 else ''})" if count
                   else "no CUDA GPU")
        raise ConfigError(f"{setting} is {device}, but this machine has {present}: name one it "
                          "has, or cpu")
    return f"cuda:{index}"


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


@pydantic_dataclass(frozen=True)
class SentenceSpan:
    """One sentence of a ranked document as the filter read it: where it lies in the
    document's text as the request sent it (`start`, `end`: character offsets, Python string
    indices, so `text[start:end]` is the sentence), whether it is a key sentence the filter
    passes on (`kept`), and the filter's P(relevant) of it (`score`; None from a filter that
    names its key sentences rather than scoring each: a two-stage filter)."""

    start: StrictInt
    end: StrictInt
    kept: StrictBool
    score: FiniteFloat | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"a sentence span needs 0 <= start <= end, got {self.start}, "
                             f"{self.end}")


@pydantic_dataclass(frozen=True)
class RerankResult:
    """One document of a rerank request (query + documents → results, best first) as it was
    ranked: the one shape of a `/v1/rerank` result, which the embedded server writes, its
    clients read and the in-process filter returns. Validated on construction.

    * `index` — the document's position in the request;
    * `relevance_score` — the reranker's score, results sorted by it, best first (sieverag's
      filter: its P("Yes") normalised over Yes/No);
    * `kept` — the filter's verdict; None from a reranker that gives none;
    * `key_sentences` — at sentence granularity, the kept document's key sentences ([] for
      one not kept); None at chunk granularity;
    * `pruned_text` — at sentence granularity, the text the filter passes on: exactly what
      the filtering proxy forwards for the document ("" for one not kept); None at chunk
      granularity;
    * `spans` — at sentence granularity (unless the request declined them), every sentence
      of the document as a `SentenceSpan`, in order; None otherwise;
    * `bar_rule` — sieverag's filter: the rule that set the bar of the request's round and
      why (`calibrated: ...`, or `shift_guard: ...` where the round's scores were unlike
      those the bar was fitted on and retrieval's top-k was kept);
    * `calibrated` — sieverag's filter: whether `relevance_score` is a calibrated P(relevant)
      (the card's fitted combination, on a round its shift guard finds like the rounds it
      was fitted on); false: a relevance score in [0, 1] that ranks as P(relevant) would, but
      is not a probability there (`bar_rule` says what was unlike);
    * `document` — `{"text": ...}` where the request asked for the texts back.
    """

    index: StrictInt
    relevance_score: FiniteFloat
    kept: StrictBool | None = None
    key_sentences: tuple[StrictStr, ...] | None = None
    pruned_text: StrictStr | None = None
    spans: tuple[SentenceSpan, ...] | None = None
    bar_rule: StrictStr | None = None
    calibrated: StrictBool | None = None
    document: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: Any) -> RerankResult:
        """A result of a rerank reply (its other keys ignored); pydantic's ValidationError
        where a field is missing or of the wrong type."""
        return _RERANK_RESULT.validate_python(data)

    def to_json(self) -> dict[str, Any]:
        """The result as a rerank reply holds it: the fields that are not None."""
        return _RERANK_RESULT.dump_python(self, mode="json", exclude_none=True)

    def metadata(self) -> dict[str, Any]:
        """What the framework adapters add to a document's metadata: `relevance_score`,
        `kept` (where given) and `key_sentences` (at sentence granularity)."""
        return {key: value for key, value in self.to_json().items()
                if key in ("relevance_score", "kept", "key_sentences")}

    def text(self, original: str) -> str:
        """The document's text to pass on: the pruned text where the filter kept some (what
        the proxy forwards), else (a server that sends no `pruned_text`) its key sentences
        joined by a space, else the original text."""
        if self.pruned_text:
            return self.pruned_text
        return " ".join(self.key_sentences) if self.key_sentences else original


_RERANK_RESULT = TypeAdapter(RerankResult)
