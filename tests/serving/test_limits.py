"""The embedded server's request limits on a tiny random model: body size, prompt size and
count, chat's default max_tokens, text that is not UTF-8, and CPU work kept off the event loop.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPResponse
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from tiny_server import model

from sieverag.inference.core.errors import ConfigError
from sieverag.serving.api.chat import serving as chat_serving
from sieverag.serving.api.completions import serving as completions_serving
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.engine import tokens
from sieverag.serving.local_server import LocalServer
from sieverag.serving.request_limits import PromptLimits

# The tiny model's server and its clients (`server`, `client`, `http`): tests/tiny_server.py.
pytest_plugins = ["tiny_server"]

BODY_LIMIT = 100_000  # above the longest text prompt the tiny model's context can take
CONVERSATION = [{"role": "user", "content": "Which city is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[LocalServer]:
    config = LocalServerConfig(model=str(tiny_model_dir), port=0, access_log=False,
                               max_request_bytes=BODY_LIMIT, max_prompts_per_request=3,
                               default_chat_max_tokens=4)
    with LocalServer(config) as running:
        yield running


def health_url(server: LocalServer) -> str:
    return server.base_url.removesuffix("/v1") + "/health"


def raw_exchange(server: LocalServer, request: bytes) -> tuple[int, dict[str, Any]]:
    """Send `request` bytes as they are (perhaps an unfinished body); read the response."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(request)
        response = HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read())


ENDPOINT_MODULES = (completions_serving, chat_serving)


def calls_of(monkeypatch: pytest.MonkeyPatch, name: str) -> list[object]:
    """Record each call of `<name>` by the completions and chat endpoints (still calling it)."""
    calls: list[object] = []
    for module in ENDPOINT_MODULES:
        if not hasattr(module, name):
            continue
        real = getattr(module, name)

        def recorded(*args: Any, real: Any = real, **kwargs: Any) -> Any:
            calls.append(args)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)
    return calls


def assert_refused(response: httpx.Response, status: int, param: str | None,
                   code: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert (error["param"], error["code"]) == (param, code)
    return error


# ----- the request body -----

def test_a_body_declared_too_large_is_refused_before_it_is_sent(server: LocalServer) -> None:
    """Content-Length over the limit: the 413 comes back although no body byte was sent."""
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n")
    status, body = raw_exchange(server, head)
    assert status == 413
    assert body["error"]["code"] == "request_too_large"
    assert body["error"]["type"] == "invalid_request_error"
    assert str(BODY_LIMIT) in body["error"]["message"]
    assert httpx.get(health_url(server), timeout=30).json() == {"status": "ok"}


def test_a_chunked_body_is_refused_once_it_passes_the_limit(server: LocalServer) -> None:
    """No Content-Length: the 413 comes back once the bytes read pass the limit, although the
    body has not ended (its closing chunk is never sent)."""
    size = BODY_LIMIT + 1
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
               b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
               + f"{size:x}\r\n".encode() + b" " * size)
    status, body = raw_exchange(server, request)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert httpx.get(health_url(server), timeout=30).json() == {"status": "ok"}


def test_a_chunked_body_within_the_limit_is_served(server: LocalServer, http: httpx.Client
                                                   ) -> None:
    body = json.dumps({"model": model(server), "prompt": "Hello", "max_tokens": 2}).encode()
    chunks = iter([body[:10], body[10:]])  # an iterator: httpx sends it chunked
    response = http.post("/completions", content=chunks,
                         headers={"Content-Type": "application/json"})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2


# ----- prompt sizes -----

@pytest.mark.parametrize(("path", "param", "build"), [
    ("/completions", "prompt", lambda text: {"prompt": text}),
    ("/completions", "prompt", lambda text: {"prompt": ["short", text]}),
    ("/chat/completions", "messages",
     lambda text: {"messages": [{"role": "user", "content": text}]}),
])
def test_text_too_long_for_the_context_is_refused_before_tokenising(
    server: LocalServer, http: httpx.Client, monkeypatch: pytest.MonkeyPatch, path: str,
    param: str, build: Callable[[str], dict[str, Any]]
) -> None:
    served = server.engine.served
    most_chars = served.max_model_len * tokens.max_token_chars(served.tokenizer)
    tokenised = calls_of(monkeypatch, "encode_text")
    response = http.post(path, json={"model": model(server), **build("a" * (most_chars + 1))})
    error = assert_refused(response, 400, param, "context_length_exceeded")
    assert "characters, and one token stands for at most" in error["message"]
    assert tokenised == []


def test_token_ids_are_checked_before_they_are_decoded(
    server: LocalServer, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding token ids into text and offsets costs time quadratic in their number: a prompt
    of more ids than the context, or holding an id outside the vocabulary, is never decoded."""
    decoded = calls_of(monkeypatch, "encode_ids")
    too_long = http.post("/completions", json={"model": model(server), "prompt": [5] * 16_000})
    assert_refused(too_long, 400, "prompt", "context_length_exceeded")
    assert "16000 tokens" in too_long.json()["error"]["message"]
    unknown = http.post("/completions", json={"model": model(server),
                                              "prompt": [[5, 6], [5, 49_152]]})
    assert "outside the vocabulary" in assert_refused(unknown, 400, "prompt", None)["message"]
    assert decoded == []
    fits = http.post("/completions", json={"model": model(server), "prompt": [5, 6, 7],
                                           "max_tokens": 1})
    assert fits.status_code == 200 and len(decoded) == 1


def test_prompts_per_completions_request_are_capped(server: LocalServer, http: httpx.Client
                                                    ) -> None:
    many = http.post("/completions", json={"model": model(server), "prompt": ["a"] * 4})
    assert "at most 3" in assert_refused(many, 400, "prompt", None)["message"]
    three = http.post("/completions", json={"model": model(server), "prompt": ["a"] * 3,
                                            "max_tokens": 1})
    assert three.status_code == 200 and len(three.json()["choices"]) == 3


# ----- chat's default max_tokens -----

def test_chat_without_max_tokens_gets_the_server_default(server: LocalServer,
                                                         http: httpx.Client) -> None:
    body = {"model": model(server), "messages": CONVERSATION, "temperature": 0}
    default = http.post("/chat/completions", json=body).json()
    assert default["usage"]["completion_tokens"] == 4
    assert default["choices"][0]["finish_reason"] == "length"
    asked = http.post("/chat/completions", json={**body, "max_tokens": 6}).json()
    assert asked["usage"]["completion_tokens"] == 6


def test_chat_default_max_tokens_is_lowered_to_the_context_left() -> None:
    limits = PromptLimits(max_model_len=1024, vocabulary_size=100, max_token_chars=8,
                          max_prompts_per_request=4, default_chat_max_tokens=256,
                          max_rerank_documents=4, max_request_tokens=1000)
    assert limits.chat_max_tokens(None, 10) == 256
    assert limits.chat_max_tokens(None, 1000) == 24
    assert limits.chat_max_tokens(None, 1024) == 1  # then refused: no room for one token
    assert limits.chat_max_tokens(7, 1000) == 7  # what the client asks is checked, not lowered


def test_limit_settings_are_validated() -> None:
    for name in ("max_request_bytes", "max_prompts_per_request", "default_chat_max_tokens",
                 "max_rerank_documents"):
        with pytest.raises(ConfigError, match=name):
            LocalServerConfig(**{name: 0})


# ----- text that is not UTF-8 -----

@pytest.mark.parametrize(("path", "body", "param"), [
    ("/completions", b'{"model": "M", "prompt": "a\\ud800b"}', "prompt"),
    ("/completions", b'{"model": "M", "prompt": ["fine", "\\udfff"]}', "prompt"),
    ("/completions", b'{"model": "M", "prompt": "hi", "stop": ["\\ud83d"]}', "stop"),
    ("/completions", b'{"model": "M", "prompt": "hi", "user": "\\ud83d"}', "user"),
    ("/chat/completions", b'{"model": "M", "messages": [{"role": "user", "content": "\\ud800"}]}',
     "messages"),
    ("/chat/completions", b'{"model": "M", "messages": [{"role": "user", "content": '
     b'[{"type": "text", "text": "ok \\udc00"}]}]}', "messages"),
    ("/completions", b'{"model": "M", "prompt": "a\xed\xa0\x80b"}', "prompt"),  # raw surrogate
    ("/completions", b'{"model": "M", "prompt": "a\xffb"}', None),  # not UTF-8 at all
    ("/completions", b'{"model": "M", "prompt": "hi", "\\ud800": 1}', None),  # a key
])
def test_text_that_is_not_utf8_is_refused_without_a_traceback(
    server: LocalServer, http: httpx.Client, caplog: pytest.LogCaptureFixture, path: str,
    body: bytes, param: str | None
) -> None:
    caplog.set_level(logging.INFO)
    response = http.post(path, content=body.replace(b'"M"', json.dumps(model(server)).encode()),
                         headers={"Content-Type": "application/json"})
    error = assert_refused(response, 400, param, None)
    assert "UTF-8" in error["message"]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []
    fine = http.post("/completions", json={"model": model(server), "prompt": "fine ✓",
                                           "max_tokens": 1})
    assert fine.status_code == 200


# ----- CPU work off the event loop -----

@pytest.mark.parametrize(("endpoint", "slow_step", "path", "body"), [
    (chat_serving, "encode_text", "/chat/completions", {"messages": CONVERSATION,
                                                        "max_tokens": 2}),
    (completions_serving, "completion_body", "/completions", {
        "prompt": "Score me", "max_tokens": 2, "logprobs": 1, "echo": True}),
])
def test_health_answers_while_a_request_works(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch, endpoint: ModuleType,
    slow_step: str, path: str, body: dict[str, Any]
) -> None:
    """A request held inside tokenising or building its response does not hold the server:
    /health answers before that step is let go (on the event loop it would answer after)."""
    entered, release = threading.Event(), threading.Event()
    order: list[str] = []
    real = getattr(endpoint, slow_step)

    def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(timeout=20)
        order.append(slow_step)
        return real(*args, **kwargs)

    monkeypatch.setattr(endpoint, slow_step, held)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, server.base_url + path,
                              json={"model": model(server), **body}, timeout=60)
        assert entered.wait(timeout=60)
        health = httpx.get(health_url(server), timeout=60)
        order.append("health")
        release.set()
        reply = pending.result()
    assert health.json() == {"status": "ok"} and reply.status_code == 200
    assert order == ["health", slow_step]


# ----- token offsets -----

def test_prefix_offsets_decoded_in_batches_equal_one_batch(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = server.engine.served.tokenizer
    ids = tokenizer("héllo ✓ wörld, and a few more words")["input_ids"]
    whole = tokens.prefix_offsets(tokenizer, ids, skip_special_tokens=False)
    monkeypatch.setattr(tokens, "PREFIX_BATCH", 3)
    assert tokens.prefix_offsets(tokenizer, ids, skip_special_tokens=False) == whole
    assert len(whole) == len(ids) and whole == sorted(whole) and whole[0] == 0
