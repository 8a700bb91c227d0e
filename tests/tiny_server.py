"""The embedded server on the tiny random model and its clients, as the serving tests use
them. A test module imports the fixtures it needs (`from tiny_server import client, server`);
a module that defines its own `server` (other settings, adapters) still gets `client` and
`http` on it.

* `server` — the server, no adapter, started once per module;
* `client` — the `openai` SDK's client on it (no retries); `http` — an httpx client;
* `model(server)` — the served base model's name;
* `fail_next_decode_step` — the engine's next decode step raises (a batch failing);
* `keyed_filter_server(...)` / `keyed_http(...)` — a server with one adapter served as
  "filter", every chunk scored by it, behind an API key (the rerank and metrics tests');
* `ServeProcess` — `sieverag serve` in a process of its own, its output read as it comes:
  `announced()` waits for the line that says where it serves.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
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


# What `sieverag serve` prints once it takes requests.
ANNOUNCED = re.compile(
    r"serving (?P<names>.+) at (?P<url>http://127\.0\.0\.1:(?P<port>\d+)/v1)")


class ServeProcess:
    """`sieverag serve ARGS` in a process of its own (stdout and stderr together), every line
    it prints kept in `seen`."""

    def __init__(self, args: Sequence[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sieverag", "serve", *args], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        self.seen: list[str] = []
        self._lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        stream = self.process.stdout
        self._reader = threading.Thread(
            target=lambda: [self._lines.put(line) for line in stream], daemon=True)
        self._reader.start()

    def announced(self, timeout_s: float) -> re.Match[str]:
        """The line saying where it serves; it must come within `timeout_s` (its output so
        far is the failure's message)."""
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.process.poll() is None and time.monotonic() < deadline, self.log
            try:
                self.seen.append(self._lines.get(timeout=0.5))
            except queue.Empty:
                continue
            found = ANNOUNCED.search(self.seen[-1])
            if found is not None:
                return found

    @property
    def log(self) -> str:
        """Everything it printed so far."""
        while not self._lines.empty():
            self.seen.append(self._lines.get())
        return "".join(self.seen)

    def kill(self) -> None:
        """Stop it if it still runs, and read the rest of what it printed."""
        self.process.kill()
        self.process.wait(timeout=30)
        self._reader.join(timeout=10)
