"""POST /v1/completions: its request body (OpenAI's, field by field under the field policy)
and its answer, whole and as stream chunks."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, StrictInt, Tag

from sieverag.serving.api.field_policy import OnlyAt
from sieverag.serving.api.generation_protocol import (
    MAX_LOGPROBS,
    FinishReason,
    GenerationRequest,
    TokenUsage,
)
from sieverag.serving.api.request_fields import Text


def _prompt_shape(prompt: Any) -> str:
    """The one branch of `Prompt` that validates `prompt`, chosen by its first element: trying
    each in turn would type-check every element of a long token-id list against each."""
    if not isinstance(prompt, list):
        return "prompt:text"
    first = prompt[0] if prompt else ""
    return ("prompt:texts" if isinstance(first, str)
            else "prompt:id_lists" if isinstance(first, list) else "prompt:ids")


Prompt = Annotated[
    Annotated[Text, Tag("prompt:text")] | Annotated[list[Text], Tag("prompt:texts")]
    | Annotated[list[StrictInt], Tag("prompt:ids")]
    | Annotated[list[list[StrictInt]], Tag("prompt:id_lists")],
    Discriminator(_prompt_shape),
]


class CompletionRequest(GenerationRequest):
    """POST /v1/completions."""

    prompt: Prompt = Field(description="a prompt, a list of prompts, or token ids")
    max_tokens: StrictInt = Field(16, ge=0, description="tokens to generate (0 with echo)")
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS,
                                       description="alternatives per token")
    echo: bool = Field(False, description="return the prompt (and its log-probs) too")
    best_of: Annotated[StrictInt | None, OnlyAt(
        "null or 1", "this server returns one choice per request",
        lambda n: n is None or n == 1)] = None
    suffix: Annotated[Text | None, OnlyAt(
        'null or ""', "inserting text before a suffix is not implemented",
        lambda suffix: not suffix)] = None

    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list: each a string or a list of token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and isinstance(prompt[0], int):
            return [prompt]
        return list(prompt)


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
    usage: TokenUsage | None = None  # a stream's chunks: None but in the usage chunk
