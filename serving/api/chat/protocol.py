"""POST /v1/chat/completions: its request body (OpenAI's, field by field under the field
policy: tools, structured output and other modalities refused by name) and its answer, whole
and as stream chunks."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, StrictInt, Tag, model_validator

from sieverag.serving.api.field_policy import Ignored, OnlyAt, is_empty
from sieverag.serving.api.generation_protocol import (
    MAX_LOGPROBS,
    FinishReason,
    GenerationRequest,
    TokenUsage,
)
from sieverag.serving.api.request_fields import LENIENT, Text, text_or_object

_NO_TOOLS = "tool calls are not implemented: this server runs no tools"
_TEXT_ONLY = "this server reads and writes text only"


class ContentPart(BaseModel):
    """One part of a message's content: text only."""

    model_config = LENIENT

    type: Annotated[str, OnlyAt('"text"', f"{_TEXT_ONLY}: images, audio and files cannot "
                                "be read", lambda kind: kind == "text")]
    text: Text = Field(description="the part's text")


class ChatMessageIn(BaseModel):
    model_config = LENIENT

    role: Annotated[str, OnlyAt(
        '"system", "developer", "user" or "assistant"',
        "tool and function messages cannot be honoured: this server runs no tools",
        lambda role: role in ("system", "developer", "user", "assistant"))]
    content: Annotated[Annotated[Text, Tag("value:text")]
                       | Annotated[list[ContentPart], Tag("value:object")],
                       Discriminator(text_or_object)] = Field(
        description="a string, or a list of text parts joined")
    name: Annotated[Any, Ignored("the chat template is given each message's role and text")
                    ] = None
    refusal: Annotated[Any, Ignored(
        "a past reply's refusal note; the chat template reads its text")] = None
    annotations: Annotated[Any, Ignored(
        "a past reply's citations; the chat template reads its text")] = None
    tool_calls: Annotated[Any, OnlyAt("null or []", _NO_TOOLS, is_empty)] = None
    function_call: Annotated[Any, OnlyAt("null", _NO_TOOLS, lambda call: call is None)] = None
    audio: Annotated[Any, OnlyAt("null", _TEXT_ONLY, lambda audio: audio is None)] = None

    def as_template_message(self) -> dict[str, str]:
        """{role, content} as a chat template reads it (developer counts as system)."""
        text = (self.content if isinstance(self.content, str)
                else "".join(part.text for part in self.content))
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(GenerationRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessageIn] = Field(min_length=1, description="the conversation, "
                                          "rendered by the model's chat template")
    max_tokens: StrictInt | None = Field(None, ge=1, description="default: the server's "
                                         "default_chat_max_tokens, lowered to the context left")
    max_completion_tokens: StrictInt | None = Field(None, ge=1, description="newer spelling "
                                                    "of max_tokens")
    logprobs: bool = Field(False, description="return the chosen tokens' log-probs")
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS,
                                           description="alternatives per token (needs logprobs)")
    tools: Annotated[Any, OnlyAt("null or []", _NO_TOOLS, is_empty)] = None
    tool_choice: Annotated[Any, OnlyAt(
        'null, "none" or "auto"', _NO_TOOLS, lambda choice: choice in (None, "none", "auto"))
    ] = None
    parallel_tool_calls: Annotated[Any, Ignored("without tools there is no tool call")] = None
    functions: Annotated[Any, OnlyAt("null or []", _NO_TOOLS, is_empty)] = None
    function_call: Annotated[Any, OnlyAt(
        'null, "none" or "auto"', _NO_TOOLS, lambda call: call in (None, "none", "auto"))
    ] = None
    response_format: Annotated[Any, OnlyAt(
        'null or {"type": "text"}', "structured output (json_object, json_schema) is not "
        "implemented", lambda format: format is None or format == {"type": "text"})] = None
    modalities: Annotated[Any, OnlyAt(
        'null or ["text"]', _TEXT_ONLY, lambda kinds: kinds is None or kinds == ["text"])
    ] = None
    audio: Annotated[Any, OnlyAt("null", _TEXT_ONLY, lambda audio: audio is None)] = None

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens else self.max_tokens


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: TokenUsage


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
    usage: TokenUsage | None = None
