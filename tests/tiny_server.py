"""The embedded server on the tiny random model and its clients, as the serving tests use
them. A test module imports the fixtures it needs (`from tiny_server import client, server`);
a module that defines its own `server` (other settings, adapters) still gets `client` and
`http` on it.

* `server` — the server, no adapter, started once per module;
* `client` — the `openai` SDK's client on it (no retries); `http` — an httpx client;
* `model(server)` — the served base model's name;
* `fail_next_decode_step` — the engine's next decode step raises (a batch failing).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from sieverag.serving.config import LocalServerConfig
from sieverag.serving.engine.batching import BatchingEngine
from sieverag.serving.local_server import LocalServer


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[LocalServer]:
    with LocalServer(LocalServerConfig(model=str(tiny_model_dir), port=0,
                                       access_log=False)) as running:
        yield running


@pytest.fixture()
def client(server: LocalServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture()
def http(server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


def model(server: LocalServer) -> str:
    return server.engine.served.name


def fail_next_decode_step(monkeypatch: pytest.MonkeyPatch, engine: BatchingEngine) -> None:
    """The next decode step of `engine` raises RuntimeError("injected fault"); later ones
    run as usual."""
    decode_step = engine._decode_step
    failures = iter([RuntimeError("injected fault")])

    def faulty(name: str) -> None:
        fault = next(failures, None)
        if fault is not None:
            raise fault
        decode_step(name)

    monkeypatch.setattr(engine, "_decode_step", faulty)
