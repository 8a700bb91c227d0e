"""The embedded server on the tiny random model and its clients, as the serving tests use
them. A test module imports the fixtures it needs (`from tiny_server import client, server`);
a module that defines its own `server` (other settings, adapters) still gets `client` and
`http` on it.

* `server` — the server, no adapter, started once per module;
* `client` — the `openai` SDK's client on it (no retries); `http` — an httpx client;
* `model(server)` — the served base model's name;
* `fail_next_decode_step` — the engine's next decode step raises (a batch failing);
* `keyed_filter_server(...)` / `keyed_http(...)` — a server with one adapter served as
  "filter", every chunk scored by it, behind an API key (the rerank and metrics tests').
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from sieverag.inference.filters.mcf import MCFConfig
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.engine.continuous_batching import BatchingEngine
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


@contextmanager
def keyed_filter_server(model_dir: Path, adapter_dir: Path, key_env: str, key: str,
                        **settings: object) -> Iterator[LocalServer]:
    """The tiny model served with `adapter_dir` as "filter" (MCF scores every chunk; no card:
    BM25 + dense rank) behind the API key `key`, read from `key_env`; `settings` are more
    `LocalServerConfig` fields."""
    os.environ[key_env] = key
    config = LocalServerConfig(model=str(model_dir), adapters=(f"filter={adapter_dir}",),
                               rerank=MCFConfig(always_score_chunks=True), port=0,
                               access_log=False, api_key_env=key_env, **settings)
    try:
        with LocalServer(config) as running:
            yield running
    finally:
        del os.environ[key_env]


@contextmanager
def keyed_http(server: LocalServer, key: str) -> Iterator[httpx.Client]:
    """An httpx client on `server`'s root (/v1 and /v2 routes), sending `key`."""
    with httpx.Client(base_url=server.base_url.removesuffix("/v1"), timeout=120,
                      headers={"Authorization": f"Bearer {key}"}) as client:
        yield client
