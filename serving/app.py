"""The embedded server's HTTP API: an OpenAI-compatible subset on top of `BatchingEngine`.

GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions, and POST
/v1/rerank (also /rerank, as on vLLM): the filter as a reranker (`rerank_endpoint`). A request
picks the base model or an adapter by its `model` name. Served with a `ProxyTarget`
(`--proxy-to`), /v1/chat/completions is the filtering proxy instead (`proxy`): it forwards to
another server, and generates nothing here. Every refusal is an OpenAI-style error
body with a 4xx status; the server keeps serving.

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
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from jinja2 import TemplateError
from starlette.exceptions import HTTPException

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
from sieverag.serving.limits import PromptLimits
from sieverag.serving.openai_format import chat_body, completion_body
from sieverag.serving.protocol import (
    UNENCODABLE_TEXT,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    RerankRequest,
    error_body,
)
from sieverag.serving.proxy import ChatProxy, ProxyTarget
from sieverag.serving.rerank_endpoint import check_prompts_fit, rerank_response
from sieverag.serving.tokens import EncodedPrompt, encode_ids, encode_text, max_token_chars
from sieverag.serving.upstream import UpstreamClient

logger = logging.getLogger(__name__)


def create_app(engine: BatchingEngine, options: LocalOptions, *, api_key: str | None = None,
               proxy: ProxyTarget | None = None) -> FastAPI:
    """The FastAPI app serving `engine` (which the caller starts and closes), within the
    request limits of `options`; with `proxy`, its chat endpoint is the filtering proxy."""
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

    async def respond(build: Callable[[], dict[str, Any]]) -> JSONResponse:
        """The response, its body built and serialised off the event loop."""
        return await asyncio.to_thread(lambda: JSONResponse(build()))

    @app.get("/health")
    async def health() -> JSONResponse:
        if not engine.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        data = [{"id": name, "object": "model", "created": created, "owned_by": "sieverag",
                 "root": served.name, "parent": None if name == served.name else served.name,
                 "max_model_len": served.max_model_len}
                for name in served.names]
        return JSONResponse({"object": "list", "data": data})

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> JSONResponse:
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
        results = await run_all(requests)
        return await respond(lambda: completion_body(
            body.model, prompts, results, echo=body.echo, logprobs=body.logprobs,
            tokenizer=tokenizer))

    async def chat_completions(body: ChatCompletionRequest) -> JSONResponse:
        check_model(body.model)
        prompt, max_tokens = await asyncio.to_thread(encode_chat, body)
        request = SequenceRequest(
            model=body.model, prompt_ids=prompt.ids, max_tokens=max_tokens,
            temperature=body.temperature, top_p=body.top_p, seed=body.seed,
            top_logprobs=(body.top_logprobs or 0) if body.logprobs else 0,
            stop=body.stop_strings(),
        )
        (result,) = await run_all([request])
        return await respond(lambda: chat_body(body.model, prompt, result,
                                               logprobs=body.logprobs, tokenizer=tokenizer))

    if proxy is None:
        app.post("/v1/chat/completions")(chat_completions)
    else:
        chat_proxy = ChatProxy(engine, proxy.filter_model, options.rerank, limits, upstream)
        app.post("/v1/chat/completions")(chat_proxy.handle)

    @app.post("/v1/rerank")
    @app.post("/rerank")
    async def rerank(body: RerankRequest) -> JSONResponse:
        check_model(body.model)
        texts = body.texts()
        limits.check_documents(texts)
        sentence_stage = (body.granularity == "sentence" if body.granularity is not None
                          else options.rerank.sentence_stage)
        config = dataclasses.replace(options.rerank, sentence_stage=sentence_stage)
        backend = EngineBackend(engine, body.model)
        documents = as_documents(texts)

        def rank() -> list[RerankResult]:
            check_prompts_fit(backend, limits, config, body.query, documents)
            return rank_by_filter(backend, config, body.query, texts)

        try:
            ranked = await asyncio.to_thread(rank)
        except asyncio.CancelledError:  # the client went away: so do its sequences
            backend.cancel()
            raise
        usage = backend.meter.by_agent.values()
        total_tokens = sum(u.prompt_tokens + u.completion_tokens for u in usage)
        return await respond(lambda: rerank_response(
            body.model, ranked, texts, top_n=body.top_n,
            return_documents=body.return_documents, total_tokens=total_tokens))

    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def refused(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc.errors(), request.url.path)
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


# The parameters each kind of request takes, named when it sends another one.
_PARAMETERS = ("model, prompt/messages, max_tokens, temperature, top_p, seed, stop, logprobs, "
               "top_logprobs, echo, user, n=1, stream=false and zero penalties")
_RERANK_PARAMETERS = "model, query, documents, top_n, return_documents and granularity"


def _validation_message(errors: Any, url_path: str) -> tuple[str, str | None]:
    """One clear message (and the offending parameter) from pydantic's error list for a
    request to `url_path`."""
    # A union reports every branch's error; text UTF-8 cannot encode is the one to name.
    error = next((e for e in errors if e["type"] in _UNENCODABLE), errors[0])
    path = [str(part) for part in error["loc"] if part != "body"]
    param = path[0] if path else None
    if error["type"] in _UNENCODABLE:
        return (f"{param or 'the request body'} holds text that UTF-8 cannot encode (a lone "
                "surrogate such as \\ud800): send valid Unicode text"), param
    if error["type"] == "json_invalid":
        detail = error.get("ctx", {}).get("error", "")
        return f"the request body is not valid JSON ({detail}): send a JSON object", None
    if error["type"] in ("missing", "model_attributes_type", "dict_type") and not path:
        return "the request body must be a JSON object", None
    if param == "documents" and len(path) > 1:
        return "documents must be a list of strings or of objects {\"text\": ...}", param
    if error["type"] == "extra_forbidden":
        supported = _RERANK_PARAMETERS if url_path.endswith("/rerank") else _PARAMETERS
        return (f"unsupported parameter {'.'.join(path)!r}: this server implements "
                f"{supported}"), param
    if param == "prompt" and len(path) > 1:
        return ("prompt must be a string, a list of strings, a list of token ids or a list of "
                "token-id lists"), param
    message = str(error["msg"]).removeprefix("Value error, ")
    return (f"{'.'.join(path)}: {message}" if path else message), param
