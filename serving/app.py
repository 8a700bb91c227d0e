"""The embedded server's HTTP API: an OpenAI-compatible subset on top of `BatchingEngine`.

GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions. A request
picks the base model or an adapter by its `model` name. Every refusal is an OpenAI-style
error body with a 4xx status; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from jinja2 import TemplateError
from starlette.exceptions import HTTPException

from sieverag.serving.auth import BearerAuth
from sieverag.serving.engine import (
    BatchingEngine,
    EngineClosedError,
    SequenceRequest,
    SequenceResult,
)
from sieverag.serving.openai_format import chat_body, completion_body
from sieverag.serving.protocol import APIError, ChatCompletionRequest, CompletionRequest, error_body
from sieverag.serving.tokens import EncodedPrompt, encode_ids, encode_text

logger = logging.getLogger(__name__)


def create_app(engine: BatchingEngine, *, api_key: str | None = None) -> FastAPI:
    """The FastAPI app serving `engine` (which the caller starts and closes)."""
    served = engine.served
    tokenizer = served.tokenizer
    created = int(time.time())
    app = FastAPI(title="sieverag embedded server", docs_url=None, redoc_url=None,
                  openapi_url=None)
    if api_key is not None:
        app.add_middleware(BearerAuth, api_key=api_key)
    _add_error_handlers(app)

    def check_model(name: str) -> None:
        if name not in served.names:
            raise APIError(404, f"the model {name!r} does not exist; this server serves "
                           f"{', '.join(served.names)}", param="model", code="model_not_found")

    def check_length(prompt: EncodedPrompt, max_tokens: int, param: str) -> None:
        if not prompt.ids:
            raise APIError(400, "the prompt is empty", param=param)
        if len(prompt.ids) + max_tokens > served.max_model_len:
            raise APIError(400, f"this model's maximum context length is {served.max_model_len} "
                           f"tokens; the prompt has {len(prompt.ids)} tokens and max_tokens asks "
                           f"for {max_tokens} more: shorten the prompt or lower max_tokens",
                           param=param if len(prompt.ids) >= served.max_model_len
                           else "max_tokens", code="context_length_exceeded")

    def encode_prompt(prompt: str | list[int]) -> EncodedPrompt:
        if isinstance(prompt, str):
            return encode_text(tokenizer, prompt, add_special_tokens=True)
        vocabulary = len(tokenizer)
        if any(not 0 <= token < vocabulary for token in prompt):
            raise APIError(400, f"the prompt holds token ids outside the vocabulary "
                           f"[0, {vocabulary})", param="prompt")
        return encode_ids(tokenizer, prompt)

    async def run_all(requests: list[SequenceRequest]) -> list[SequenceResult]:
        futures = [engine.submit(request) for request in requests]
        # Cancelling this handler (client gone) cancels the futures: the engine drops them.
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))

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
        prompts = [encode_prompt(prompt) for prompt in body.prompts()]
        if not prompts:
            raise APIError(400, "prompt is an empty list", param="prompt")
        for prompt in prompts:
            check_length(prompt, body.max_tokens, "prompt")
        requests = [SequenceRequest(
            model=body.model, prompt_ids=prompt.ids, max_tokens=body.max_tokens,
            temperature=body.temperature, top_p=body.top_p, seed=body.seed,
            top_logprobs=body.logprobs or 0,
            prompt_logprobs=body.echo and body.logprobs is not None, stop=body.stop_strings(),
        ) for prompt in prompts]
        results = await run_all(requests)
        return JSONResponse(completion_body(body.model, prompts, results, echo=body.echo,
                                            logprobs=body.logprobs, tokenizer=tokenizer))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> JSONResponse:
        check_model(body.model)
        messages = [message.as_template_message() for message in body.messages]
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=False)
        except (TemplateError, ValueError) as exc:
            raise APIError(400, f"the model's chat template refused the messages: {exc}",
                           param="messages") from exc
        # The rendered template holds its own special tokens (as HFBackend renders it).
        prompt = encode_text(tokenizer, text, add_special_tokens=False)
        max_tokens = body.token_limit()
        if max_tokens is None:
            max_tokens = max(served.max_model_len - len(prompt.ids), 0)
        check_length(prompt, max_tokens, "messages")
        request = SequenceRequest(
            model=body.model, prompt_ids=prompt.ids, max_tokens=max_tokens,
            temperature=body.temperature, top_p=body.top_p, seed=body.seed,
            top_logprobs=(body.top_logprobs or 0) if body.logprobs else 0,
            stop=body.stop_strings(),
        )
        (result,) = await run_all([request])
        return JSONResponse(chat_body(body.model, prompt, result, logprobs=body.logprobs,
                                      tokenizer=tokenizer))

    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def refused(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc.errors())
        return JSONResponse(error_body(message, "invalid_request_error", param),
                            status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = (f"no route {request.method} {request.url.path}" if exc.status_code == 404
                   else f"{request.method} {request.url.path}: {exc.detail}")
        return JSONResponse(error_body(message, "invalid_request_error"),
                            status_code=exc.status_code)

    @app.exception_handler(EngineClosedError)
    async def closed(_: Request, exc: EngineClosedError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "server_error"), status_code=503)

    @app.exception_handler(Exception)
    async def crashed(_: Request, exc: Exception) -> JSONResponse:
        logger.error("request failed", exc_info=exc)
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}",
                                       "server_error"), status_code=500)


def _validation_message(errors: Any) -> tuple[str, str | None]:
    """One clear message (and the offending parameter) from pydantic's error list."""
    error = errors[0]
    path = [str(part) for part in error["loc"] if part != "body"]
    param = path[0] if path else None
    if error["type"] == "json_invalid":
        detail = error.get("ctx", {}).get("error", "")
        return f"the request body is not valid JSON ({detail}): send a JSON object", None
    if error["type"] in ("missing", "model_attributes_type", "dict_type") and not path:
        return "the request body must be a JSON object", None
    if error["type"] == "extra_forbidden":
        return (f"unsupported parameter {'.'.join(path)!r}: this server implements model, "
                "prompt/messages, max_tokens, temperature, top_p, seed, stop, logprobs, "
                "top_logprobs, echo, user, n=1, stream=false and zero penalties"), param
    if param == "prompt" and len(path) > 1:
        return ("prompt must be a string, a list of strings, a list of token ids or a list of "
                "token-id lists"), param
    message = str(error["msg"]).removeprefix("Value error, ")
    return (f"{'.'.join(path)}: {message}" if path else message), param
