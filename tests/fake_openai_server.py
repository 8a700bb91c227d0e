"""A scriptable stand-in for an OpenAI-compatible server, for tests that must not touch a network.

`FakeOpenAIServer` binds 127.0.0.1 port 0 (`base_url` names the port it got) and serves every
POST from a script: queued `Reply` objects are used first, in order, then the `responder`
function (by default a chat reply that echoes the last user message). A reply can carry any
status, headers and body (a dict is sent as JSON, a str or bytes verbatim, so broken JSON is
easy) and a delay, so rate limits, server errors, timeouts and malformed bodies can all be
staged; or it can be a stream of chunks (server-sent events), optionally held after the first
chunk until the test releases it, or a dropped connection. Every request is recorded with its
path, headers, raw body bytes and parsed JSON body. With `faults` (a `FaultSchedule` of
tests/fake_openai_faults.py) requests meet a seeded schedule of rate limits and failures
first. `tokens_served` sums the usage of every complete 200 reply sent (`served` lists each
with its request): what a client was charged.

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
from collections import Counter, deque
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
    drop: bool = False


@dataclass(frozen=True)
class RecordedRequest:
    """What the server received: header names lower-cased; `json` None if the body was not JSON;
    `raw` the body's bytes."""

    path: str
    headers: dict[str, str]
    json: Any
    raw: bytes = b""
    method: str = "POST"


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

    def __init__(self, responder: Responder = echo_last_user_message, faults: Any = None) -> None:
        self.responder = responder
        self.faults = faults
        self.requests: list[RecordedRequest] = []
        self.served: list[tuple[RecordedRequest, dict[str, int]]] = []
        self.tokens_served: Counter[str] = Counter()
        self.started_at = time.monotonic()
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
        self.started_at = time.monotonic()
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
            fault = (self.faults.fault(request, time.monotonic() - self.started_at)
                     if self.faults is not None and scripted is None else None)
        if fault is not None:
            return fault
        reply = scripted if scripted is not None else self.responder(request)
        return reply if self.faults is None else self.faults.finish(request, reply)

    def _count_served(self, request: RecordedRequest, reply: Reply) -> None:
        usage = _usage_of(reply)
        if usage is not None:
            with self._lock:
                self.served.append((request, usage))
                self.tokens_served.update(usage)

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
                request = RecordedRequest(self.path, headers, payload, raw, self.command)
                reply = server._next_reply(request)
                counted = True
                try:
                    time.sleep(reply.delay_s)
                    if reply.drop:
                        self.close_connection = True
                        return
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
                    server._count_served(request, reply)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test); nothing left to tell it
                finally:
                    if counted:
                        server._finished()

            do_GET = do_POST  # the Batch API's retrieve and file content (FakeBatchAPI)

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


def _usage_of(reply: Reply) -> dict[str, int] | None:
    """The tokens a complete 200 reply carries (None: none)."""
    usage = reply.body.get("usage") if isinstance(reply.body, dict) else None
    if reply.status != 200 or reply.chunks or not isinstance(usage, dict):
        return None
    return {"prompt_tokens": usage.get("prompt_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0),
            "reasoning_tokens": (usage.get("completion_tokens_details") or {}).get(
                "reasoning_tokens", 0),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)}


class FakeBatchAPI:
    """A responder serving OpenAI's Files and Batches endpoints (their real request and reply
    shapes) in front of a chat `responder`, which answers every line of a batch as it answers
    a synchronous request (and answers those too):

    * POST /v1/files (multipart: `purpose`, `file`) stores a file; GET /v1/files/{id}/content
      gives its bytes;
    * POST /v1/batches (`input_file_id`, `endpoint`, `completion_window`) creates a batch,
      `validating`; GET /v1/batches/{id} answers `in_progress` for `polls` looks (forever
      while `hold` is set), then runs the lines and answers `completed` with
      `output_file_id`, `error_file_id` (None when no line failed) and `request_counts`;
      while `outage` is set it answers 503 instead.

    A custom id in `failures` fails (HTTP 500, in the error file) the first that many times
    it is run.
    `answered` lists the custom id of every line answered 200 (what a client pays for).
    """

    def __init__(self, responder: Responder = echo_last_user_message, *, polls: int = 1,
                 failures: dict[str, int] | None = None) -> None:
        self.responder = responder
        self.polls = polls
        self.failures = dict(failures or {})
        self.hold = threading.Event()
        self.outage = threading.Event()
        self.files: dict[str, dict[str, Any]] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.answered: list[str] = []
        self._looks: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, request: RecordedRequest) -> Reply:
        path = request.path.split("?")[0]
        with self._lock:
            if request.method == "POST" and path == "/v1/files":
                return self._upload(request)
            if request.method == "GET" and path.startswith("/v1/files/") \
                    and path.endswith("/content"):
                data = self.files.get(path.split("/")[3])
                return (Reply(body=data["content"]) if data is not None
                        else Reply(status=404, body={"error": {"message": "no such file"}}))
            if request.method == "POST" and path == "/v1/batches":
                return self._create(request.json or {})
            if request.method == "GET" and path.startswith("/v1/batches/"):
                if self.outage.is_set():
                    return Reply(status=503, body={"error": {"message": "unavailable"}})
                return self._retrieve(path.split("/")[3])
        return self.responder(request)

    def _store(self, content: bytes, filename: str, purpose: str) -> dict[str, Any]:
        file_id = f"file-{len(self.files) + 1}"
        self.files[file_id] = {"id": file_id, "object": "file", "bytes": len(content),
                               "created_at": int(time.time()), "filename": filename,
                               "purpose": purpose, "status": "processed", "content": content}
        return {k: v for k, v in self.files[file_id].items() if k != "content"}

    def _upload(self, request: RecordedRequest) -> Reply:
        from email.parser import BytesParser
        from email.policy import HTTP

        form = BytesParser(policy=HTTP).parsebytes(
            f"Content-Type: {request.headers.get('content-type', '')}\r\n\r\n".encode()
            + request.raw)
        parts = {part.get_param("name", header="content-disposition"): part
                 for part in form.iter_parts()}
        if "file" not in parts or "purpose" not in parts:
            return Reply(status=400, body={"error": {"message": "file and purpose needed"}})
        purpose = parts["purpose"].get_payload(decode=True).decode()
        filename = parts["file"].get_param("filename", header="content-disposition") or "file"
        return Reply(body=self._store(parts["file"].get_payload(decode=True), filename, purpose))

    def _create(self, body: dict[str, Any]) -> Reply:
        missing = [k for k in ("input_file_id", "endpoint", "completion_window") if k not in body]
        if missing or body["input_file_id"] not in self.files:
            return Reply(status=400, body={"error": {"message": f"bad batch: {missing or body}"}})
        batch_id = f"batch_{len(self.batches) + 1}"
        self.batches[batch_id] = {
            "id": batch_id, "object": "batch", "endpoint": body["endpoint"],
            "input_file_id": body["input_file_id"],
            "completion_window": body["completion_window"], "status": "validating",
            "created_at": int(time.time()), "output_file_id": None, "error_file_id": None,
            "errors": None, "metadata": body.get("metadata"),
            "request_counts": {"total": 0, "completed": 0, "failed": 0}}
        self._looks[batch_id] = 0
        return Reply(body=self.batches[batch_id])

    def _retrieve(self, batch_id: str) -> Reply:
        batch = self.batches.get(batch_id)
        if batch is None:
            return Reply(status=404, body={"error": {"message": f"no batch {batch_id}"}})
        self._looks[batch_id] += 1
        if batch["status"] != "completed":
            if self.hold.is_set() or self._looks[batch_id] <= self.polls:
                batch["status"] = "in_progress"
            else:
                self._run(batch)
        return Reply(body=batch)

    def _run(self, batch: dict[str, Any]) -> None:
        lines = self.files[batch["input_file_id"]]["content"].decode().splitlines()
        outputs, errors = [], []
        for number, text in enumerate(lines):
            line = json.loads(text)
            custom_id = line["custom_id"]
            if self.failures.get(custom_id, 0) > 0:
                self.failures[custom_id] -= 1
                reply = Reply(status=500, body={"error": {"message": "server error"}})
            else:
                reply = self.responder(RecordedRequest(line["url"], {}, line["body"],
                                                       json.dumps(line["body"]).encode()))
            entry = {"id": f"batch_req_{batch['id']}_{number}", "custom_id": custom_id,
                     "response": {"status_code": reply.status,
                                  "request_id": f"req_{number}", "body": reply.body},
                     "error": None}
            (outputs if reply.status == 200 else errors).append(entry)
            if reply.status == 200:
                self.answered.append(custom_id)

        def jsonl(entries: list[dict[str, Any]], name: str) -> str | None:
            if not entries:
                return None
            content = "".join(json.dumps(e) + "\n" for e in entries).encode()
            return self._store(content, name, "batch_output")["id"]

        batch.update(status="completed", output_file_id=jsonl(outputs, "output.jsonl"),
                     error_file_id=jsonl(errors, "errors.jsonl"),
                     request_counts={"total": len(lines), "completed": len(outputs),
                                     "failed": len(errors)})
