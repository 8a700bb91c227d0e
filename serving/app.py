"""The embedded server's HTTP API: an OpenAI-compatible subset on top of `BatchingEngine`.

GET /health, GET /v1/models, POST /v1/completions and POST /v1/chat/completions (streamed
or not: `streaming`), POST /v1/rerank (also /rerank, as on vLLM) and POST /v2/rerank
(Cohere's v2 schema): the filter as a reranker (`rerank_endpoint`). A request picks the base
model or an adapter by its `model` name; its fields are treated by the field policy
(`field_policy`: a field no model declares is named in the `x-sieverag-ignored` header), and
every body sent is a typed model (`responses`).
Served with a `ProxyTarget` (`--proxy-to`), /v1/chat/completions is the filtering proxy
instead (`proxy`): it forwards to another server, and generates nothing here. Every refusal
is an OpenAI-style error body with a 4xx status; the server keeps serving.

Sizes are checked before the work they bound: the body by `body_limit`, prompts by `limits`.
Tokenising, rendering chat templates and building responses run in worker threads, so the
event loop (and /health, and every other client) never waits for one request's CPU work.
A request whose client disconnects is cancelled (`disconnect`), its sequences with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jinja2 import TemplateError
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from sieverag.inference.filters.combination import Combination
from sieverag.inference.filters.ranking import as_documents, rank_by_filter
from sieverag.inference.llm.base import chat_prompt_text
from sieverag.inference.types import RerankResult
from sieverag.serving.auth import BearerAuth
from sieverag.serving.body_limit import BodySizeLimit, RequestTooLarge
from sieverag.serving.config import LocalOptions
from sieverag.serving.disconnect import CancelOnDisconnect
from sieverag.serving.engine import (
    BatchingEngine,
    EngineClosedError,
    SequenceRequest,
    SequenceResult,
)
from sieverag.serving.engine_backend import EngineBackend
from sieverag.serving.field_policy import CANNOT_HONOUR, ignored_header, unknown_fields
from sieverag.serving.limits import PromptLimits
from sieverag.serving.openai_format import chat_body, completion_body
from sieverag.serving.protocol import (
    UNENCODABLE_TEXT,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    RerankBody,
    RerankRequest,
    RerankV2Request,
    error_body,
    is_branch_tag,
)
from sieverag.serving.proxy import ChatProxy, ProxyTarget
from sieverag.serving.rerank_endpoint import (
    check_prompts_fit,
    cut_to_tokens,
    rerank_response,
    rerank_v2_response,
)
from sieverag.serving.responses import ModelCard, ModelList, to_json
from sieverag.serving.streaming import MEDIA_TYPE as STREAM_MEDIA_TYPE
from sieverag.serving.streaming import chat_stream, completion_stream
from sieverag.serving.tokens import EncodedPrompt, encode_ids, encode_text, max_token_chars
from sieverag.serving.upstream import UpstreamClient

logger = logging.getLogger(__name__)


def create_app(engine: BatchingEngine, options: LocalOptions, *, api_key: str | None = None,
               proxy: ProxyTarget | None = None,
               combinations: Mapping[str, Combination] | None = None) -> FastAPI:
    """The FastAPI app serving `engine` (which the caller starts and closes), within the
    request limits of `options`; with `proxy`, its chat endpoint is the filtering proxy.
    `combinations`: each served adapter's combination (from its card), by served name; a
    model without one ranks with `PRIORS_ONLY`."""
    combinations = dict(combinations or {})
    served = engine.served
    tokenizer = served.tokenizer
    limits = PromptLimits(
        max_model_len=served.max_model_len, vocabulary_size=len(tokenizer),
        max_token_chars=max_token_chars(tokenizer),
        max_prompts_per_request=options.max_prompts_per_request,
        default_chat_max_tokens=options.default_chat_max_tokens,
        max_rerank_documents=options.max_rerank_documents)
    created = int(time.time())
    upstream = UpstreamClient(proxy.upstream) if proxy is not None else None

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if upstream is None:
            yield
            return
        upstream.open()  # the proxy's connection pool lives on the server's event loop
        try:
            yield
        finally:
            await upstream.aclose()

    app = FastAPI(title="sieverag embedded server", docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=lifespan)
    app.add_middleware(CancelOnDisconnect)  # innermost: it watches once the body is read
    app.add_middleware(BodySizeLimit, max_bytes=options.max_request_bytes)
    if api_key is not None:  # added last, so it runs first: a client without the key gets 401
        app.add_middleware(BearerAuth, api_key=api_key)
    _add_error_handlers(app)

    def check_model(name: str) -> None:
        if name not in served.names:
            raise APIError(404, f"the model {name!r} does not exist; this server serves "
                           f"{', '.join(served.names)}", param="model", code="model_not_found")

    # The functions below run in worker threads (asyncio.to_thread): tokenising, rendering
    # templates and building log-prob tables take CPU time the event loop must not wait for.

    def encode_prompts(prompts: list[str | list[int]], max_tokens: int) -> list[EncodedPrompt]:
        encoded = [encode_text(tokenizer, prompt, add_special_tokens=True)
                   if isinstance(prompt, str) else encode_ids(tokenizer, prompt)
                   for prompt in prompts]
        for prompt in encoded:
            limits.check_encoded(prompt, max_tokens, "prompt")
        return encoded

    def encode_chat(body: ChatCompletionRequest) -> tuple[EncodedPrompt, int]:
        messages = [message.as_template_message() for message in body.messages]
        try:
            text = chat_prompt_text(tokenizer, messages)
        except (TemplateError, ValueError) as exc:
            raise APIError(400, f"the model's chat template refused the messages: {exc}",
                           param="messages") from exc
        requested = body.token_limit()
        # Without max_tokens, the prompt must still leave room for one token.
        limits.check_before_encoding(text, requested or 1, "messages")
        # The rendered template holds its own special tokens (as HFBackend renders it).
        prompt = encode_text(tokenizer, text, add_special_tokens=False)
        max_tokens = limits.chat_max_tokens(requested, len(prompt.ids))
        limits.check_encoded(prompt, max_tokens, "messages")
        return prompt, max_tokens

    async def run_all(requests: list[SequenceRequest]) -> list[SequenceResult]:
        futures = [engine.submit(request) for request in requests]
        try:
            return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))
        except BaseException:
            # Cancelled (the client went away) or one prompt failed: the rest are not wanted.
            engine.cancel(futures)
            raise

    async def respond(body: BaseModel, build: Callable[[], BaseModel]) -> Response:
        """The response to request `body`, built and serialised off the event loop, with the
        header naming the fields of `body` that were ignored."""
        content = await asyncio.to_thread(lambda: to_json(build()))
        return Response(content, media_type="application/json",
                        headers=ignored_header(unknown_fields(body)))

    def stream(body: BaseModel, events: AsyncIterator[bytes]) -> StreamingResponse:
        """The streamed response to request `body` (see `streaming`)."""
        return StreamingResponse(events, media_type=STREAM_MEDIA_TYPE,
                                 headers=ignored_header(unknown_fields(body)))

    @app.get("/health")
    async def health() -> JSONResponse:
        if not engine.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> Response:
        cards = [ModelCard(id=name, created=created, root=served.name,
                           parent=None if name == served.name else served.name,
                           max_model_len=served.max_model_len)
                 for name in served.names]
        return Response(to_json(ModelList(data=cards)), media_type="application/json")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Response:
        check_model(body.model)
        texts_or_ids = body.prompts()
        limits.check_count(texts_or_ids)
        for prompt in texts_or_ids:
            limits.check_before_encoding(prompt, body.max_tokens, "prompt")
        prompts = await asyncio.to_thread(encode_prompts, texts_or_ids, body.max_tokens)
        requests = [SequenceRequest(
            model=body.model, prompt_ids=prompt.ids, max_tokens=body.max_tokens,
            temperature=body.temperature, top_p=body.top_p, seed=body.seed,
            top_logprobs=body.logprobs or 0,
            prompt_logprobs=body.echo and body.logprobs is not None, stop=body.stop_strings(),
        ) for prompt in prompts]
        if body.stream:
            return stream(body, completion_stream(
                engine, requests, prompts, model=body.model, echo=body.echo,
                logprobs=body.logprobs, include_usage=body.include_usage(),
                tokenizer=tokenizer))
        results = await run_all(requests)
        return await respond(body, lambda: completion_body(
            body.model, prompts, results, echo=body.echo, logprobs=body.logprobs,
            tokenizer=tokenizer))

    async def chat_completions(body: ChatCompletionRequest) -> Response:
        check_model(body.model)
        prompt, max_tokens = await asyncio.to_thread(encode_chat, body)
        request = SequenceRequest(
            model=body.model, prompt_ids=prompt.ids, max_tokens=max_tokens,
            temperature=body.temperature, top_p=body.top_p, seed=body.seed,
            top_logprobs=(body.top_logprobs or 0) if body.logprobs else 0,
            stop=body.stop_strings(),
        )
        if body.stream:
            return stream(body, chat_stream(
                engine, request, prompt, model=body.model, logprobs=body.logprobs,
                include_usage=body.include_usage(), tokenizer=tokenizer))
        (result,) = await run_all([request])
        return await respond(body, lambda: chat_body(
            body.model, prompt, result, logprobs=body.logprobs, tokenizer=tokenizer))

    if proxy is None:
        app.post("/v1/chat/completions")(chat_completions)
    else:
        chat_proxy = ChatProxy(engine, proxy.filter_model, options.rerank, limits, upstream,
                               combinations.get(proxy.filter_model))
        app.post("/v1/chat/completions")(chat_proxy.handle)

    async def rank(body: RerankBody) -> tuple[list[RerankResult], list[str], int, int]:
        """The filter's ranking of the documents of `body`, their texts (as the request sent
        them) and the prompt and completion tokens the filter used."""
        check_model(body.model)
        texts = body.texts()
        judged = texts
        if body.max_tokens_per_doc is not None and texts:
            judged = await asyncio.to_thread(cut_to_tokens, tokenizer, texts,
                                             body.max_tokens_per_doc)
        limits.check_documents(judged)
        sentence_stage = (body.granularity == "sentence" if body.granularity is not None
                          else options.rerank.sentence_stage)
        config = dataclasses.replace(options.rerank, sentence_stage=sentence_stage)
        backend = EngineBackend(engine, body.model)
        documents = as_documents(judged)

        combination = combinations.get(body.model)

        def run() -> list[RerankResult]:
            check_prompts_fit(backend, limits, config, body.query, documents,
                              combination.filter_format if combination else "two_stage")
            return rank_by_filter(backend, config, body.query, judged, combination)

        try:
            ranked = await asyncio.to_thread(run)
        except asyncio.CancelledError:  # the client went away: so do its sequences
            backend.cancel()
            raise
        usage = backend.meter.by_agent.values()
        return (ranked, texts, sum(u.prompt_tokens for u in usage),
                sum(u.completion_tokens for u in usage))

    @app.post("/v1/rerank")
    @app.post("/rerank")
    async def rerank(body: RerankRequest) -> Response:
        ranked, texts, prompt_tokens, completion_tokens = await rank(body)
        return await respond(body, lambda: rerank_response(
            body.model, ranked, texts, top_n=body.top_n, return_documents=body.return_documents,
            total_tokens=prompt_tokens + completion_tokens))

    @app.post("/v2/rerank")
    async def rerank_v2(body: RerankV2Request) -> Response:
        ranked, _, prompt_tokens, completion_tokens = await rank(body)
        return await respond(body, lambda: rerank_v2_response(
            ranked, top_n=body.top_n, input_tokens=prompt_tokens,
            output_tokens=completion_tokens))

    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def refused(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc.errors())
        return JSONResponse(error_body(message, "invalid_request_error", param),
                            status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif isinstance(exc.__cause__, UnicodeDecodeError):  # FastAPI's JSON parsing failed
            message = "the request body is not valid UTF-8: send JSON encoded as UTF-8"
        else:
            message = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(error_body(message, "invalid_request_error"),
                            status_code=exc.status_code)

    @app.exception_handler(RequestTooLarge)
    async def too_large(_: Request, exc: RequestTooLarge) -> JSONResponse:
        return exc.response()

    @app.exception_handler(EngineClosedError)
    async def closed(_: Request, exc: EngineClosedError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "server_error"), status_code=503)

    @app.exception_handler(Exception)
    async def crashed(_: Request, exc: Exception) -> JSONResponse:
        logger.error("request failed", exc_info=exc)
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}",
                                       "server_error"), status_code=500)


# Text fields (`Text`) and keys (pydantic's own string_unicode) that UTF-8 cannot encode.
_UNENCODABLE = (UNENCODABLE_TEXT, "string_unicode")


def _validation_message(errors: Any) -> tuple[str, str | None]:
    """One clear message (and the offending parameter) from pydantic's error list."""
    # A union reports every branch's error; text UTF-8 cannot encode, then a value that
    # cannot be honoured, are the ones to name.
    error = next((e for e in errors if e["type"] in _UNENCODABLE),
                 next((e for e in errors if e["type"] == CANNOT_HONOUR), errors[0]))
    path = _field_path(error["loc"])
    param = path.split(".")[0].split("[")[0] or None
    if error["type"] == CANNOT_HONOUR:
        return f"{path} cannot be honoured here: {error['msg']}", param
    if error["type"] in _UNENCODABLE:
        return (f"{param or 'the request body'} holds text that UTF-8 cannot encode (a lone "
                "surrogate such as \\ud800): send valid Unicode text"), param
    if error["type"] == "json_invalid":
        detail = error.get("ctx", {}).get("error", "")
        return f"the request body is not valid JSON ({detail}): send a JSON object", None
    if error["type"] in ("missing", "model_attributes_type", "dict_type") and not path:
        return "the request body must be a JSON object", None
    if param == "documents" and "[" in path:
        return "documents must be a list of strings or of objects {\"text\": ...}", param
    if param == "messages" and path.endswith(".content"):
        return (f"{path} must be a string or a list of parts {{\"type\": \"text\", "
                "\"text\": ...}"), param
    if param == "prompt" and "[" in path:
        return ("prompt must be a string, a list of strings, a list of token ids or a list of "
                "token-id lists"), param
    message = str(error["msg"]).removeprefix("Value error, ")
    return (f"{path}: {message}" if path else message), param


def _field_path(location: Any) -> str:
    """A field's place in the body as a client spells it: `messages[0].content[1].type`."""
    path = ""
    for part in location:
        if part == "body" and not path:
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        elif not is_branch_tag(part):
            path += f".{part}" if path else part
    return path
