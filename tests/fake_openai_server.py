"""A scriptable stand-in for an OpenAI-compatible server, for tests that must not touch a network.

`FakeOpenAIServer` binds 127.0.0.1 port 0 (`base_url` names the port it got) and serves every
POST from a script: queued `Reply` objects are used first, in order, then the `responder`
function (by default a chat reply that echoes the last user message). A reply can carry any
status, headers and body (a dict is sent as JSON, a str or bytes verbatim, so broken JSON is
easy) and a delay, so rate limits, server errors, timeouts and malformed bodies can all be
staged; or it can be a stream of chunks (server-sent events), optionally held after the first
chunk until the test releases it. Every request is recorded with its path, headers, raw body
bytes and parsed JSON body.

    with FakeOpenAIServer() as server:
        server.script(Reply(status=429, headers={"Retry-After": "0.1"}),
                      Reply(body=chat_reply("hi")))
        ...  # point a client at server.base_url
        assert len(server.requests) == 2
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted HTTP response; `delay_s` is waited before anything is sent.

    With `chunks`, the body is those chunks (`body` unused), sent one by one as
    `text/event-stream` and ended by closing the connection; with `gate` too, the chunks after
    the first wait until the gate is set (at most `gate_timeout_s`)."""

    status: int = 200
    body: dict[str, Any] | str | bytes = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    chunks: tuple[bytes, ...] = ()
    gate: threading.Event | None = None
    gate_timeout_s: float = 10.0


@dataclass(frozen=True)
class RecordedRequest:
    """What the server received: header names lower-cased; `json` None if the body was not JSON;
    `raw` the body's bytes."""

    path: str
    headers: dict[str, str]
    json: Any
    raw: bytes = b""


Responder = Callable[[RecordedRequest], Reply]


def chat_reply(
    text: str,
    *,
    top_logprobs: Sequence[tuple[str, float]] = (),
    prompt_tokens: int = 10,
    completion_tokens: int = 1,
) -> dict[str, Any]:
    """A /chat/completions body; `top_logprobs` fills the first token's top-k list when given."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": "stop",
    }
    if top_logprobs:
        top = [{"token": token, "logprob": logprob, "bytes": None}
               for token, logprob in top_logprobs]
        choice["logprobs"] = {"content": [{**top[0], "top_logprobs": top}]}
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "choices": [choice],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def echo_reply(
    tokens: Sequence[str],
    token_logprobs: Sequence[float | None],
    *,
    prompt_tokens: int | None = None,
    completion_tokens: int = 1,
) -> dict[str, Any]:
    """A /completions body with `echo=true` logprobs; text offsets are computed from `tokens`."""
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    n_prompt = len(tokens) - completion_tokens if prompt_tokens is None else prompt_tokens
    return {
        "id": "cmpl-fake",
        "object": "text_completion",
        "choices": [{
            "index": 0,
            "text": "".join(tokens),
            "logprobs": {"tokens": list(tokens), "token_logprobs": list(token_logprobs),
                         "text_offset": offsets, "top_logprobs": None},
            "finish_reason": "length",
        }],
        "usage": {"prompt_tokens": n_prompt, "completion_tokens": completion_tokens,
                  "total_tokens": n_prompt + completion_tokens},
    }


def echo_last_user_message(request: RecordedRequest) -> Reply:
    """Default responder: a chat reply whose text is the last user message, prefixed 'echo: '."""
    messages = (request.json or {}).get("messages") or [{"content": ""}]
    return Reply(body=chat_reply(f"echo: {messages[-1]['content']}"))


class FakeOpenAIServer:
    """A threaded local HTTP server replaying scripted replies; use it as a context manager."""

    def __init__(self, responder: Responder = echo_last_user_message) -> None:
        self.responder = responder
        self.requests: list[RecordedRequest] = []
        self.max_in_flight = 0
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        # A short poll interval lets shutdown() return quickly at the end of each test.
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,),
                                        daemon=True)

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL, ending in /v1."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def script(self, *replies: Reply) -> None:
        """Queue replies to be served, in order, before falling back to the responder."""
        with self._lock:
            self._queue.extend(replies)

    def paths(self) -> list[str]:
        """The paths of the requests received so far, in arrival order."""
        return [request.path for request in self.requests]

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def _next_reply(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            scripted = self._queue.popleft() if self._queue else None
        return scripted if scripted is not None else self.responder(request)

    def _finished(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    payload = json.loads(raw)
                except ValueError:
                    payload = None
                headers = {name.lower(): value for name, value in self.headers.items()}
                request = RecordedRequest(self.path, headers, payload, raw)
                reply = server._next_reply(request)
                counted = True
                try:
                    time.sleep(reply.delay_s)
                    if reply.chunks:
                        self._stream(reply)
                        return
                    body = reply.body
                    data = (json.dumps(body).encode() if isinstance(body, dict)
                            else body.encode() if isinstance(body, str) else body)
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    # No longer in flight once the body goes out: the client may send its next
                    # request the moment the body arrives, before this thread runs on.
                    server._finished()
                    counted = False
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test); nothing left to tell it
                finally:
                    if counted:
                        server._finished()

            def _stream(self, reply: Reply) -> None:
                """The chunks, each sent as it comes; the closed connection ends the body."""
                self.send_response(reply.status)
                self.send_header("Content-Type", "text/event-stream")
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                for index, chunk in enumerate(reply.chunks):
                    if index == 1 and reply.gate is not None:
                        reply.gate.wait(reply.gate_timeout_s)
                    self.wfile.write(chunk)
                    self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                """Stay quiet: pytest output is for failures."""

        return Handler
