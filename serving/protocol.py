"""The request bodies the embedded server accepts (OpenAI's, and the Cohere/Jina rerank body
vLLM serves), and its error type.

Bodies are validated strictly: an unknown parameter is refused with a 400 naming it rather
than silently ignored, so a client never believes a setting took effect when it did not.
`n` must be 1, `stream` false and the penalties 0 (none is implemented); `user` is accepted
and ignored. Every text field is `Text`: a string UTF-8 can encode, for JSON can spell a lone
surrogate ("\\ud800"), which no tokenizer takes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictInt,
    Tag,
    model_validator,
)
from pydantic_core import PydanticCustomError

# The most alternatives per token a request may ask for (the OpenAI API's and vLLM's limit).
MAX_LOGPROBS = 20

ErrorType = Literal["invalid_request_error", "server_error"]

# The pydantic error type of a text field that UTF-8 cannot encode.
UNENCODABLE_TEXT = "unencodable_text"


def _encodable(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError(UNENCODABLE_TEXT, "text that UTF-8 cannot encode (a lone "
                                  "surrogate such as \\ud800)") from None
    return text


Text = Annotated[str, AfterValidator(_encodable)]


def _prompt_shape(prompt: Any) -> str:
    """The one branch of `Prompt` that validates `prompt`, chosen by its first element: trying
    each in turn would type-check every element of a long token-id list against each."""
    if not isinstance(prompt, list):
        return "text"
    first = prompt[0] if prompt else ""
    return "texts" if isinstance(first, str) else "id_lists" if isinstance(first, list) else "ids"


Prompt = Annotated[
    Annotated[Text, Tag("text")] | Annotated[list[Text], Tag("texts")]
    | Annotated[list[StrictInt], Tag("ids")] | Annotated[list[list[StrictInt]], Tag("id_lists")],
    Discriminator(_prompt_shape),
]


class APIError(Exception):
    """A request the server refuses, sent as an OpenAI-style error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: ErrorType = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: ErrorType, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """{"error": {"message", "type", "param", "code"}}, as the OpenAI API answers errors."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class _RequestBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Text = Field(description="served model name: the base model or an adapter name")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    seed: StrictInt | None = Field(None, description="seed for sampling (temperature > 0)")
    stop: Text | list[Text] | None = Field(None, description="stop strings, cut from the text")
    n: Literal[1] = Field(1, description="choices per prompt: only 1 is supported")
    stream: Literal[False] = Field(False, description="streaming is not supported")
    user: Text | None = Field(None, description="end-user id; accepted and ignored")
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0, description="only 0 is supported")
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0, description="only 0 is supported")

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(s for s in stops if s)


class CompletionRequest(_RequestBody):
    """POST /v1/completions."""

    prompt: Prompt = Field(description="a prompt, a list of prompts, or token ids")
    max_tokens: StrictInt = Field(16, ge=0, description="tokens to generate (0 with echo)")
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS,
                                       description="alternatives per token")
    echo: bool = Field(False, description="return the prompt (and its log-probs) too")

    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list: each a string or a list of token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and isinstance(prompt[0], int):
            return [prompt]
        return list(prompt)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: Text


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[TextPart]
    name: Text | None = None

    def as_template_message(self) -> dict[str, str]:
        """{role, content} as a chat template reads it (developer counts as system)."""
        text = (self.content if isinstance(self.content, str)
                else "".join(part.text for part in self.content))
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(_RequestBody):
    """POST /v1/chat/completions."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1, description="default: the server's "
                                         "default_chat_max_tokens, lowered to the context left")
    max_completion_tokens: StrictInt | None = Field(None, ge=1, description="newer spelling "
                                                    "of max_tokens")
    logprobs: bool = Field(False, description="return the chosen tokens' log-probs")
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS,
                                           description="alternatives per token (needs logprobs)")

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens else self.max_tokens


class RerankDocument(BaseModel):
    """A document given as an object (Jina, Cohere): its text."""

    model_config = ConfigDict(extra="forbid")

    text: Text


class RerankRequest(BaseModel):
    """POST /v1/rerank (and /rerank): the Cohere/Jina schema vLLM serves, plus `granularity`.

    The count of documents and their sizes are checked by `limits`, before any work."""

    model_config = ConfigDict(extra="forbid")

    model: Text = Field(description="served model name: the base model or an adapter name")
    query: Text = Field(description="the question the documents are judged against")
    documents: list[Text | RerankDocument] = Field(description="strings or {text} objects")
    top_n: StrictInt | None = Field(None, ge=0, description="results returned, best first; "
                                    "0 or null: every document")
    return_documents: bool = Field(True, description="return each document's text")
    granularity: Literal["chunk", "sentence"] | None = Field(
        None, description="sentence: also the kept documents' key sentences; null: the "
                          "server's default (--local.rerank.sentence-stage)")

    def texts(self) -> list[str]:
        """The documents' texts, in request order."""
        return [d if isinstance(d, str) else d.text for d in self.documents]
