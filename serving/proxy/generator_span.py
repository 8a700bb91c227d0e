"""The proxy's forward to the generator as an OpenTelemetry span (`observability.tracing`),
named and described by OpenTelemetry's GenAI semantic conventions for an inference call:
`chat {model}`, kind CLIENT, `gen_ai.operation.name` "chat", `gen_ai.provider.name` "openai"
(the API the upstream speaks, whatever serves it), `gen_ai.request.model`,
`gen_ai.request.stream`, `gen_ai.request.max_tokens`, `gen_ai.request.temperature`,
`gen_ai.request.top_p`, `server.address` and `server.port`; from the answer,
`gen_ai.response.id`, `gen_ai.response.model`, `gen_ai.response.finish_reasons`,
`gen_ai.usage.input_tokens` and `gen_ai.usage.output_tokens` (the upstream's `usage`), and
`http.response.status_code`; a failure sets `error.type` (the proxy's error code, or the
upstream's status). The span's context goes upstream in the `traceparent` header, so a
generator that traces (vLLM's `--otlp-traces-endpoint`) continues the request's trace. A
stream's span ends when its answer starts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from sieverag.serving.observability import tracing
from sieverag.serving.proxy.upstream import Upstream

# The GenAI conventions' request attributes, by the chat request field that gives each.
_REQUEST_FIELDS = {"max_tokens": "gen_ai.request.max_tokens",
                   "max_completion_tokens": "gen_ai.request.max_tokens",
                   "temperature": "gen_ai.request.temperature", "top_p": "gen_ai.request.top_p"}


@contextmanager
def generator_span(upstream: Upstream, body: Any, headers: dict[str, str], *,
                   streaming: bool) -> Iterator[Any]:
    """The span of forwarding `body` to `upstream` (current inside the block), its context
    added to `headers`, the request headers that go upstream."""
    if not tracing.active():
        yield tracing.NO_SPAN
        return
    fields = body if isinstance(body, dict) else {}
    model = upstream.model or fields.get("model")
    model = model if isinstance(model, str) else None
    where = urlsplit(upstream.chat_url)
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                  "gen_ai.request.model": model, "gen_ai.request.stream": streaming,
                  "server.address": where.hostname, "server.port": where.port}
    attributes |= {name: fields[field] for field, name in _REQUEST_FIELDS.items()
                   if isinstance(fields.get(field), (int, float))
                   and not isinstance(fields.get(field), bool)}
    with tracing.span(f"chat {model}" if model else "chat", attributes, client=True) as span:
        tracing.inject(headers)
        yield span


def record_answer(span: Any, status: int, answer: bytes | None = None) -> None:
    """What the upstream answered (`status`, and the body of a whole answer) on `span`."""
    if not tracing.active():
        return
    span.set_attribute("http.response.status_code", status)
    if status >= 400:
        tracing.failed(span, str(status))
        return
    try:
        reply = json.loads(answer) if answer is not None else None
    except ValueError:
        return
    if not isinstance(reply, dict):
        return
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
    choices = reply.get("choices") if isinstance(reply.get("choices"), list) else []
    reasons = [c["finish_reason"] for c in choices
               if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)]
    tracing.record(span, {
        "gen_ai.response.id": _text(reply.get("id")),
        "gen_ai.response.model": _text(reply.get("model")),
        "gen_ai.response.finish_reasons": reasons or None,
        "gen_ai.usage.input_tokens": _count(usage.get("prompt_tokens")),
        "gen_ai.usage.output_tokens": _count(usage.get("completion_tokens"))})


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
