"""The embedded server's response bodies, typed: every shape it sends is declared here once.

OpenAI's completions and chat completions (whole, and as stream chunks), the model list, the
rerank bodies (`/v1/rerank`: the Cohere v1/Jina/vLLM schema; `/v2/rerank`: Cohere's v2
schema, its `meta` included) and the error body. Each rerank result is `RerankResult`
(inference/types.py), which the in-process filter and the endpoint's clients share; a rerank
body is sent without its None fields (`RerankResult.to_json`'s rule), every other body whole,
nulls included, as OpenAI sends them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from sieverag.inference.types import RerankResult

FinishReason = Literal["stop", "length"]
ErrorType = Literal["invalid_request_error", "server_error"]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens)


# ----- /v1/completions -----

class CompletionLogprobs(BaseModel):
    """The legacy log-prob table: one entry per token (the first prompt token's is None)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None  # None in a stream chunk before the last


class Completion(BaseModel):
    """A /v1/completions body, and (object "text_completion" too) each chunk of its stream."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None  # a stream's chunks: None but in the usage chunk


# ----- /v1/chat/completions -----

class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class ChatMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


# ----- /v1/models -----

class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "sieverag"
    root: str
    parent: str | None
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ----- rerank -----

class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    """POST /v1/rerank: the Cohere v1/Jina/vLLM schema."""

    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class ApiVersion(BaseModel):
    version: Literal["2"] = "2"


class BilledUnits(BaseModel):
    search_units: int = 1


class MetaTokens(BaseModel):
    input_tokens: int
    output_tokens: int


class RerankMeta(BaseModel):
    """Cohere's `meta`: the API version, billed units (one search) and the tokens used."""

    api_version: ApiVersion = Field(default_factory=ApiVersion)
    billed_units: BilledUnits = Field(default_factory=BilledUnits)
    tokens: MetaTokens


class RerankV2Response(BaseModel):
    """POST /v2/rerank: Cohere's v2 schema (results carry no document)."""

    id: str
    results: list[RerankResult]
    meta: RerankMeta


# ----- errors -----

class ErrorDetail(BaseModel):
    message: str
    type: ErrorType
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """{"error": {"message", "type", "param", "code"}}, as the OpenAI API answers errors."""

    error: ErrorDetail

    @classmethod
    def of(cls, message: str, type: ErrorType, param: str | None = None,
           code: str | None = None) -> ErrorResponse:
        return cls(error=ErrorDetail(message=message, type=type, param=param, code=code))


def to_json(response: BaseModel) -> bytes:
    """A response body as sent: JSON, rerank bodies without their None fields (a log-prob
    that is not finite is sent as null: JSON has no spelling for it)."""
    exclude_none = isinstance(response, (RerankResponse, RerankV2Response))
    return response.model_dump_json(exclude_none=exclude_none).encode()
