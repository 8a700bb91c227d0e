"""How every failure of a request becomes OpenAI's error body with its status: a refusal
(`APIError`), a body that does not validate (400, one message naming the field), a route that
does not exist (404), a body too large (413), a stopped engine (503), a crash (500, logged).
The server keeps serving after each."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from sieverag.serving.api.field_policy import CANNOT_HONOUR
from sieverag.serving.api.middleware.body_limit import RequestTooLarge
from sieverag.serving.api.request_fields import UNENCODABLE_TEXT, is_branch_tag
from sieverag.serving.engine.sequence_types import EngineClosedError
from sieverag.serving.refusals import APIError, error_body

logger = logging.getLogger(__name__)

# Text fields (`Text`) and keys (pydantic's own string_unicode) that UTF-8 cannot encode.
_UNENCODABLE = (UNENCODABLE_TEXT, "string_unicode")


async def refused(_: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = validation_message(exc.errors())
    return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}"
    elif isinstance(exc.__cause__, UnicodeDecodeError):  # FastAPI's JSON parsing failed
        message = "the request body is not valid UTF-8: send JSON encoded as UTF-8"
    else:
        message = f"{request.method} {request.url.path}: {exc.detail}"
    return JSONResponse(error_body(message, "invalid_request_error"),
                        status_code=exc.status_code)


async def too_large(_: Request, exc: RequestTooLarge) -> JSONResponse:
    return exc.response()


async def closed(_: Request, exc: EngineClosedError) -> JSONResponse:
    return JSONResponse(error_body(str(exc), "server_error"), status_code=503)


async def crashed(_: Request, exc: Exception) -> JSONResponse:
    logger.error("request failed", exc_info=exc)
    return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}",
                                   "server_error"), status_code=500)


def add_error_handlers(app: FastAPI) -> None:
    """Register every handler above on `app`."""
    app.add_exception_handler(APIError, refused)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestTooLarge, too_large)
    app.add_exception_handler(EngineClosedError, closed)
    app.add_exception_handler(Exception, crashed)


def validation_message(errors: Any) -> tuple[str, str | None]:
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
    if param in ("documents", "texts") and "[" in path:
        return f"{param} must be a list of strings or of objects {{\"text\": ...}}", param
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
