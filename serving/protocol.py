"""The OpenAI-compatible request bodies the embedded server accepts, and its error type.

Bodies are validated strictly: an unknown parameter is refused with a 400 naming it rather
than silently ignored, so a client never believes a setting took effect when it did not.
`n` must be 1, `stream` false and the penalties 0 (none is implemented); `user` is accepted
and ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

# The most alternatives per token a request may ask for (the OpenAI API's and vLLM's limit).
MAX_LOGPROBS = 20

ErrorType = Literal["invalid_request_error", "server_error"]


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

    model: str = Field(description="served model name: the base model or an adapter name")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    seed: StrictInt | None = Field(None, description="seed for sampling (temperature > 0)")
    stop: str | list[str] | None = Field(None, description="stop strings, cut from the text")
    n: Literal[1] = Field(1, description="choices per prompt: only 1 is supported")
    stream: Literal[False] = Field(False, description="streaming is not supported")
    user: str | None = Field(None, description="end-user id; accepted and ignored")
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0, description="only 0 is supported")
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0, description="only 0 is supported")

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(s for s in stops if s)


class CompletionRequest(_RequestBody):
    """POST /v1/completions."""

    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]] = Field(
        description="a prompt, a list of prompts, or token ids")
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
            return [[int(token) for token in prompt]]
        return list(prompt)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def as_template_message(self) -> dict[str, str]:
        """{role, content} as a chat template reads it (developer counts as system)."""
        text = (self.content if isinstance(self.content, str)
                else "".join(part.text for part in self.content))
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(_RequestBody):
    """POST /v1/chat/completions."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1, description="default: the rest of the "
                                         "context")
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
