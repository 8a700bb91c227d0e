"""The request bodies the embedded server accepts (OpenAI's completions and chat, the
Cohere/Jina/vLLM rerank body at /v1/rerank and Cohere's v2 one at /v2/rerank), and its error
type.

What happens to each field is the field policy (`field_policy`), declared here field by
field: a plain field is honoured; `Ignored` ones change nothing here and are dropped; `OnlyAt`
ones are honoured at their no-op value and refused (400, naming the field) at any other, as
this server cannot do what they ask (`n` above 1, tools, structured output); a field no model
declares is accepted and named in the response's `x-sieverag-ignored` header. Every text
field is `Text`: a string UTF-8 can encode, for JSON can spell a lone surrogate
("\\ud800"), which no tokenizer takes.
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

from sieverag.serving.field_policy import Ignored, OnlyAt, is_empty
from sieverag.serving.responses import ErrorResponse, ErrorType

# The most alternatives per token a request may ask for (the OpenAI API's and vLLM's limit).
MAX_LOGPROBS = 20

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


# Union branches are tagged "<what>:<shape>": an error's location holds the tag, which the
# server's error message leaves out (`is_branch_tag`).
def is_branch_tag(part: str) -> bool:
    return ":" in part


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


def _text_or_object(value: Any) -> str:
    return "value:text" if isinstance(value, str) else "value:object"


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
    return ErrorResponse.of(message, type, param, code).model_dump(mode="json")


# Every request model accepts fields it does not declare (`field_policy.unknown_fields`).
_LENIENT = ConfigDict(extra="allow")

_ONE_CHOICE = OnlyAt("1", "this server returns one choice per request", lambda n: n == 1)
_NO_PENALTY = OnlyAt("0", "presence and frequency penalties are not implemented",
                     lambda value: value == 0)
_NO_TOOLS = "tool calls are not implemented: this server runs no tools"
_TEXT_ONLY = "this server reads and writes text only"


class StreamOptions(BaseModel):
    """`stream_options`: what a stream carries besides the text."""

    model_config = _LENIENT

    include_usage: bool = Field(False, description="a last chunk holding the usage (choices [])")
    include_obfuscation: Annotated[bool | None, Ignored(
        "obfuscation pads chunks against network side channels; the text streamed is the same"
    )] = None


class _RequestBody(BaseModel):
    model_config = _LENIENT

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


class CompletionRequest(_RequestBody):
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


class ContentPart(BaseModel):
    """One part of a message's content: text only."""

    model_config = _LENIENT

    type: Annotated[str, OnlyAt('"text"', f"{_TEXT_ONLY}: images, audio and files cannot "
                                "be read", lambda kind: kind == "text")]
    text: Text = Field(description="the part's text")


class ChatMessageIn(BaseModel):
    model_config = _LENIENT

    role: Annotated[str, OnlyAt(
        '"system", "developer", "user" or "assistant"',
        "tool and function messages cannot be honoured: this server runs no tools",
        lambda role: role in ("system", "developer", "user", "assistant"))]
    content: Annotated[Annotated[Text, Tag("value:text")]
                       | Annotated[list[ContentPart], Tag("value:object")],
                       Discriminator(_text_or_object)] = Field(
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


class ChatCompletionRequest(_RequestBody):
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


class RerankDocument(BaseModel):
    """A document given as an object (Jina, Cohere): its text."""

    model_config = _LENIENT

    text: Text = Field(description="the document's text")


class RerankBody(BaseModel):
    """What both rerank schemas share. The count of documents and their sizes are checked by
    `limits`, before any work."""

    model_config = _LENIENT

    model: Text = Field(description="served model name: the base model or an adapter name")
    query: Text = Field(description="the question the documents are judged against")
    documents: list[Annotated[Annotated[Text, Tag("value:text")]
                              | Annotated[RerankDocument, Tag("value:object")],
                              Discriminator(_text_or_object)]] = Field(
        description="strings or {text} objects")
    top_n: StrictInt | None = Field(None, ge=0, description="results returned, best first; "
                                    "0 or null: every document")
    max_tokens_per_doc: StrictInt | None = Field(
        None, ge=1, description="each document cut to its first this many tokens (the served "
                                "model's tokenizer) before it is judged; null: not cut")
    granularity: Literal["chunk", "sentence"] | None = Field(
        None, description="sentence: also the kept documents' key sentences; null: the "
                          "server's default (--local.rerank.sentence-stage)")
    priority: Annotated[Any, Ignored(
        "requests are batched as they arrive; the results are the same")] = None

    def texts(self) -> list[str]:
        """The documents' texts, in request order."""
        return [d if isinstance(d, str) else d.text for d in self.documents]


class RerankRequest(RerankBody):
    """POST /v1/rerank (and /rerank): the Cohere v1/Jina schema vLLM serves, plus
    `granularity` and `max_tokens_per_doc`."""

    return_documents: bool = Field(True, description="return each document's text")


class RerankV2Request(RerankBody):
    """POST /v2/rerank: Cohere's v2 schema, plus `granularity`."""

    relevant_spans: Annotated[Any, OnlyAt(
        'null or {"mode": "disabled"}', 'relevant spans are not implemented (granularity '
        '"sentence" gives the kept documents\' key sentences)',
        lambda spans: spans is None or (isinstance(spans, dict)
                                        and spans.get("mode") == "disabled"))] = None
