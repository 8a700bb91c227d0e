"""What /v1/completions and /v1/chat/completions share: the sampling and streaming fields of
their requests (`GenerationRequest`), and `TokenUsage` in their answers.

What happens to each field is the field policy (`field_policy`), declared here field by
field: a plain field is honoured; `Ignored` ones change nothing here and are dropped; `OnlyAt`
ones are honoured at their no-op value and refused (400, naming the field) at any other, as
this server cannot do what they ask (`n` above 1, penalties, logit biases).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictInt

from sieverag.serving.api.field_policy import Ignored, OnlyAt, is_empty
from sieverag.serving.api.request_fields import LENIENT, Text

# The most alternatives per token a request may ask for (the OpenAI API's and vLLM's limit).
MAX_LOGPROBS = 20

FinishReason = Literal["stop", "length"]

_ONE_CHOICE = OnlyAt("1", "this server returns one choice per request", lambda n: n == 1)
_NO_PENALTY = OnlyAt("0", "presence and frequency penalties are not implemented",
                     lambda value: value == 0)


class StreamOptions(BaseModel):
    """`stream_options`: what a stream carries besides the text."""

    model_config = LENIENT

    include_usage: bool = Field(False, description="a last chunk holding the usage (choices [])")
    include_obfuscation: Annotated[bool | None, Ignored(
        "obfuscation pads chunks against network side channels; the text streamed is the same"
    )] = None


class GenerationRequest(BaseModel):
    """The fields completions and chat requests share."""

    model_config = LENIENT

    model: Text = Field(description="served model name: the base model or an adapter name")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    seed: StrictInt | None = Field(None, description="seed for sampling (temperature > 0)")
    stop: Text | list[Text] | None = Field(None, description="stop strings, cut from the text")
    stream: bool = Field(False, description="send the reply as server-sent events")
    stream_options: StreamOptions | None = Field(None, description="with stream: include_usage")
    n: Annotated[StrictInt, _ONE_CHOICE] = 1
    presence_penalty: Annotated[float, _NO_PENALTY] = 0.0
    frequency_penalty: Annotated[float, _NO_PENALTY] = 0.0
    logit_bias: Annotated[dict[str, float] | None, OnlyAt(
        "null or {}", "logit biases are not implemented", is_empty)] = None
    user: Annotated[Text | None, Ignored("an end-user id, for a provider's abuse monitoring")
                    ] = None
    store: Annotated[Any, Ignored("this server keeps no completions")] = None
    metadata: Annotated[Any, Ignored("tags for stored completions; none is stored")] = None
    service_tier: Annotated[Any, Ignored("this server has one tier")] = None
    prompt_cache_key: Annotated[Any, Ignored(
        "a routing hint for a provider's prompt cache; one process serves here")] = None
    safety_identifier: Annotated[Any, Ignored("an end-user id, for abuse monitoring")] = None
    priority: Annotated[Any, Ignored(
        "requests are batched as they arrive; the reply is the same")] = None

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(s for s in stops if s)

    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


class TokenUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> TokenUsage:
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens)
