"""Abandoned work leaves the embedded server: a cancelled sequence (its client gone) leaves the
engine's queue or running batch within one decode step, and a request whose client disconnects
while it is being tokenised never reaches the engine. Step counts, not clocks, bound the tests;
the deadlines in `wait_for` only stop a hang.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from sieverag.serving.api.chat import serving as chat_serving
from sieverag.serving.api.completions import serving as completions_serving
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.engine.continuous_batching import BatchingEngine
from sieverag.serving.engine.sequence_types import SequenceRequest, SequenceResult, TokenListener
from sieverag.serving.engine.served_model import load_served_model
from sieverag.serving.local_server import LocalServer

LONG = 900  # max_tokens no test waits for: only cancellation ends these sequences early
DISCONNECT_LOGGER = "sieverag.serving.api.middleware.disconnect"


def decode_steps(engine: BatchingEngine) -> int:
    return sum(engine.stats.decode_batch_sizes.values())


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll `condition` until it holds; the deadline only guards against a hang."""
    deadline = time.monotonic() + 120
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.002)


def assert_let_go_within_one_step(engine: BatchingEngine, steps_at_cancel: int) -> None:
    """The engine drops every sequence before running more than the decode step under way
    when they were cancelled."""
    while engine.in_flight:
        assert decode_steps(engine) <= steps_at_cancel + 1, "a cancelled sequence kept decoding"
        time.sleep(0.001)
    assert decode_steps(engine) <= steps_at_cancel + 1


@pytest.fixture()
def engine(tiny_model_dir: Path) -> Iterator[BatchingEngine]:
    served = load_served_model(str(tiny_model_dir), ())
    running = BatchingEngine(served, max_batch_size=2, batch_window_s=0.05)
    running.start()
    yield running
    running.close()


def prompt(engine: BatchingEngine, text: str, max_tokens: int) -> SequenceRequest:
    ids = tuple(engine.served.tokenizer(text)["input_ids"])
    return SequenceRequest(model=engine.served.name, prompt_ids=ids, max_tokens=max_tokens)


# ----- the engine -----

def test_cancelled_running_and_waiting_sequences_leave_within_one_decode_step(
    engine: BatchingEngine
) -> None:
    """Two sequences run (max_batch_size=2) and two wait for room; cancelling all four empties
    the engine within one decode step, and it then serves new work."""
    futures = [engine.submit(prompt(engine, f"Story {i}:", LONG)) for i in range(4)]
    wait_for(lambda: engine.stats.decode_batch_sizes[2] >= 3, "two running sequences")
    assert engine.in_flight == 4
    steps = decode_steps(engine)
    engine.cancel(futures)
    assert_let_go_within_one_step(engine, steps)
    assert all(f.cancelled() for f in futures) and engine.stats.cancelled == 4
    after = engine.submit(prompt(engine, "Still there?", 3)).result(timeout=60)
    assert len(after.token_ids) == 3 and engine.in_flight == 0


def test_a_sequence_left_alone_in_its_batch_computes_what_it_computes_alone(
    engine: BatchingEngine
) -> None:
    kept, dropped = prompt(engine, "Count with me: one", 48), prompt(engine, "Other", LONG)
    alone = engine.submit(kept).result(timeout=60)
    futures = [engine.submit(kept), engine.submit(dropped)]
    wait_for(lambda: engine.stats.decode_batch_sizes[2] >= 3, "both sequences running")
    engine.cancel(futures[1:])
    survivor = futures[0].result(timeout=60)
    assert survivor.token_ids == alone.token_ids
    assert [t.logprob for t in survivor.logprobs] == pytest.approx(
        [t.logprob for t in alone.logprobs], abs=1e-4)
    wait_for(lambda: engine.in_flight == 0, "the cancelled sequence to leave")
    assert engine.stats.cancelled == 1


def test_a_forward_pass_nobody_wants_stops_at_its_next_decoder_layer(
    engine: BatchingEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while its third pass (prefill, decode, decode) is in its first decoder
    layer, a lone sequence's pass computes no further layer, and the sequence leaves. The
    engine checks before every layer of every pass: the prefill's through the model's forward
    (a pre-hook on each decoder layer), a decode step's through the step itself."""
    layers = engine.served.model.config.num_hidden_layers
    assert layers >= 2
    calls: list[int] = []
    futures: list[Future[SequenceResult]] = []
    check = engine._before_layer

    def cancel_on_third_pass(index: int) -> None:
        calls.append(index)
        if calls.count(0) == 3:
            engine.cancel(futures)
        check(index)

    monkeypatch.setattr(engine, "_before_layer", cancel_on_third_pass)
    futures.append(engine.submit(prompt(engine, "Tell me a story:", LONG)))
    wait_for(lambda: engine.in_flight == 0, "the cancelled sequence to leave")
    assert calls == [*range(layers)] * 2 + [0]
    assert futures[0].cancelled() and engine.stats.cancelled == 1


# ----- clients that disconnect -----

@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[LocalServer]:
    with LocalServer(LocalServerConfig(model=str(tiny_model_dir), port=0,
                                       access_log=False)) as running:
        yield running


def send_and_keep_open(server: LocalServer, path: str, body: dict[str, Any]) -> socket.socket:
    """A whole request sent on a connection left open; closing it is the client going away."""
    data = json.dumps({"model": server.engine.served.name, **body}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(f"POST /v1{path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                 f"application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def disconnect_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == DISCONNECT_LOGGER]


def record_submits(monkeypatch: pytest.MonkeyPatch, engine: BatchingEngine,
                   on_cancel: Callable[[], None] = lambda: None) -> list[SequenceRequest]:
    """Record what reaches `engine.submit`; `on_cancel` runs as each such future is cancelled
    (in the cancelling thread, at that moment)."""
    submitted: list[SequenceRequest] = []
    real = engine.submit

    def recorded(request: SequenceRequest, listener: TokenListener | None = None, *,
                 owner: Hashable | None = None) -> Future[SequenceResult]:
        submitted.append(request)
        future = real(request, listener, owner=owner)
        future.add_done_callback(lambda f: on_cancel() if f.cancelled() else None)
        return future

    monkeypatch.setattr(engine, "submit", recorded)
    return submitted


def test_clients_that_disconnect_leave_no_sequence_in_the_engine(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Four clients whose requests decode together go away: their sequences are cancelled and
    leave the batch within one decode step of the last cancellation."""
    caplog.set_level(logging.INFO, logger=DISCONNECT_LOGGER)
    engine = server.engine
    steps_at_cancel: list[int] = []
    submitted = record_submits(monkeypatch, engine,
                               on_cancel=lambda: steps_at_cancel.append(decode_steps(engine)))
    cancelled_before, together_before = engine.stats.cancelled, engine.stats.decode_batch_sizes[4]
    bodies = [{"prompt": "Tell me a story", "max_tokens": LONG},
              {"prompt": [5, 6, 7], "max_tokens": LONG},
              {"prompt": ["Two prompts", "in one request"], "max_tokens": LONG}]
    sockets = [send_and_keep_open(server, "/completions", body) for body in bodies]
    wait_for(lambda: engine.stats.decode_batch_sizes[4] > together_before + 2,
             "the four sequences decoding together")
    for sock in sockets:
        sock.close()
    wait_for(lambda: engine.in_flight == 0, "the engine to let go of the sequences")
    assert len(submitted) == len(steps_at_cancel) == 4
    assert decode_steps(engine) <= max(steps_at_cancel) + 1
    assert engine.stats.cancelled - cancelled_before == 4
    assert len(disconnect_records(caplog)) == 3
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []  # no traceback
    served = httpx.post(server.base_url + "/completions", timeout=60, json={
        "model": engine.served.name, "prompt": "Hello", "max_tokens": 2})
    assert served.json()["usage"]["completion_tokens"] == 2
    assert len(disconnect_records(caplog)) == 3  # a request answered is not a disconnect


@pytest.mark.parametrize(("path", "body"), [
    ("/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story"}],
                           "max_tokens": LONG, "stream": True, "logprobs": True}),
    ("/completions", {"prompt": ["One story", "and another"], "max_tokens": LONG,
                      "stream": True, "echo": True}),
])
def test_a_client_gone_mid_stream_leaves_no_sequence_in_the_engine(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    path: str, body: dict[str, Any]
) -> None:
    """A streaming client that reads its first events and goes away: its sequences are
    cancelled and leave the batch within one decode step, as an unstreamed request's do."""
    caplog.set_level(logging.INFO, logger=DISCONNECT_LOGGER)
    engine = server.engine
    steps_at_cancel: list[int] = []
    submitted = record_submits(monkeypatch, engine,
                               on_cancel=lambda: steps_at_cancel.append(decode_steps(engine)))
    cancelled_before = engine.stats.cancelled
    with send_and_keep_open(server, path, body) as sock:
        received = b""
        while received.count(b"data: ") < 3:  # the stream is under way
            received += sock.recv(65536)
        assert received.startswith(b"HTTP/1.1 200")
    wait_for(lambda: engine.in_flight == 0, "the engine to let go of the sequences")
    assert len(submitted) == len(steps_at_cancel) == len(body.get("prompt", [None]))
    assert decode_steps(engine) <= max(steps_at_cancel) + 1
    assert engine.stats.cancelled - cancelled_before == len(submitted)
    assert len(disconnect_records(caplog)) == 1
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize(("endpoint", "path", "body"), [
    (completions_serving, "/completions", {"prompt": "Tokenise me", "max_tokens": LONG}),
    (chat_serving, "/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                         "max_tokens": LONG}),
])
def test_a_client_gone_while_its_prompt_is_tokenised_submits_nothing(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    endpoint: ModuleType, path: str, body: dict[str, Any]
) -> None:
    """The tokenising thread cannot be stopped, but what it returns after its client went away
    is dropped: no sequence is submitted for it."""
    caplog.set_level(logging.INFO, logger=DISCONNECT_LOGGER)
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()
    real = endpoint.encode_text

    def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(timeout=60)
        try:
            return real(*args, **kwargs)
        finally:
            returned.set()

    monkeypatch.setattr(endpoint, "encode_text", held)
    submitted = record_submits(monkeypatch, server.engine)
    with send_and_keep_open(server, path, body):
        assert entered.wait(timeout=60)
    wait_for(lambda: disconnect_records(caplog), "the server to notice the disconnect")
    release.set()
    assert returned.wait(timeout=60)
    monkeypatch.setattr(endpoint, "encode_text", real)
    served = httpx.post(server.base_url + "/completions", timeout=60, json={
        "model": server.engine.served.name, "prompt": "After", "max_tokens": 1})
    assert served.status_code == 200
    assert [r.max_tokens for r in submitted] == [1]  # only the request answered
    assert server.engine.in_flight == 0


def test_a_long_prefill_stops_between_slices_once_its_client_is_gone(
    engine: BatchingEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt of three slices whose request is cancelled during the first slice's forward
    pass runs no further slice, and leaves the engine."""
    from sieverag.serving.engine import scheduling

    monkeypatch.setattr(scheduling, "PROMPT_SLICE", 16)
    request = prompt(engine, " ".join(f"word{i}" for i in range(16)), LONG)
    assert 32 < len(request.prompt_ids) <= 48
    passes: list[int] = []
    futures: list[Future[SequenceResult]] = []

    def count_and_cancel(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        passes.append(kwargs["input_ids"].shape[1])
        engine.cancel(futures)

    hook = engine.served.model.register_forward_pre_hook(count_and_cancel, with_kwargs=True)
    try:
        futures.append(engine.submit(request))
        wait_for(lambda: engine.in_flight == 0, "the cancelled prefill to leave")
    finally:
        hook.remove()
    assert passes == [16] and futures[0].cancelled() and engine.stats.cancelled == 1
