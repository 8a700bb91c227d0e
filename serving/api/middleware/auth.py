"""API keys: read from an environment variable (never a command-line value, which other users
can see in the process list), and checked on every request but /health's, so that a route
added later (as /v2/rerank was) is protected from the start. Keys are never logged."""

from __future__ import annotations

import hmac
import os

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from sieverag.inference.core.errors import ConfigError
from sieverag.serving.refusals import error_body

# The paths open without the key: the liveness probe, as on vLLM.
OPEN_PATHS = frozenset({"/health"})


def read_api_key(env_var: str | None, flag: str = "--api-key-env") -> str | None:
    """The key held by `env_var` (named by `flag`), or None without one; an unset or empty
    variable is an error."""
    if env_var is None:
        return None
    key = os.environ.get(env_var, "")
    if not key:
        raise ConfigError(f"environment variable {env_var} ({flag}) is not set or empty: "
                          f"export the API key in {env_var}, or drop {flag}")
    return key


class BearerAuth:
    """ASGI middleware: a request (to any path but /health) without
    `Authorization: Bearer <key>` gets a 401.

    It runs before routing and body parsing, so an unauthenticated client learns nothing
    about the request it sent. /health stays open, as on vLLM.
    """

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                body = error_body("missing or wrong API key: send the header "
                                  "'Authorization: Bearer <key>'", "invalid_request_error",
                                  code="invalid_api_key")
                response = JSONResponse(body, status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
