"""The embedded server on the tiny model with a random filter adapter, behind an API key, as
tests/serving/test_rerank.py starts it, for the rerank endpoint's clients (the framework
adapters); a small corpus to retrieve from, and the endpoint's own answer to compare with.
tests/conftest.py's `filter_url` fixture wraps `serving_filter`.

For a test module that starts its own `server` and names each path with its version
(`/rerank`, `/v1/rerank`, `/v2/rerank`): `http_at_root`, imported, is its `http` fixture, a
client at the server's root (`root(server)`) with a long timeout for filter work; and
`post(http, path, body)` sends a request that must answer 200 and returns its JSON."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from tiny_adapter import make_lora_adapter

from sieverag.inference.integrations.rerank_client import RerankEndpointError
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.local_server import LocalServer

KEY_ENV = "SIEVERAG_RERANK_CLIENT_TEST_KEY"
KEY = "sk-rerank-client-test"
FILTER = "filter"
QUERY = "Where was Liora Tamsin born?"
# id → text: a relevant document, a supporting one, two same-kind distractors, an off-topic one.
CORPUS = {
    "tamsin": "Liora Tamsin was born in Quorrin in 1848. She later worked as a cartographer. "
              "Her maps are kept in Ostmere.",
    "quorrin": "Quorrin is a port town. Liora Tamsin grew up there.",
    "bridge": "The Calder Bridge opened in 1901. It crosses a gorge. Its engineer was Wren Ivers.",
    "ivers": "Wren Ivers was born in Haldane. He designed three bridges.",
    "penguins": "Penguins huddle together in winter.",
}


@contextmanager
def serving_filter(tiny_model_dir: Path, adapter_dir: Path) -> Iterator[str]:
    """The base URL (…/v1) of a server that serves a random LoRA adapter, saved into
    `adapter_dir`, as `filter` and requires the key KEY."""
    adapter = make_lora_adapter(tiny_model_dir, adapter_dir)
    os.environ[KEY_ENV] = KEY
    config = LocalServerConfig(model=str(tiny_model_dir), adapters=(f"{FILTER}={adapter}",),
                               port=0, access_log=False, api_key_env=KEY_ENV)
    try:
        with LocalServer(config) as running:
            yield running.base_url
    finally:
        del os.environ[KEY_ENV]


def rerank_directly(base_url: str, query: str, texts: list[str],
                    granularity: str = "chunk") -> list[dict[str, Any]]:
    """The endpoint's results for `texts`, best first, asked over plain HTTP."""
    reply = httpx.post(f"{base_url}/rerank", timeout=120,
                       headers={"Authorization": f"Bearer {KEY}"},
                       json={"model": FILTER, "query": query, "documents": texts,
                             "granularity": granularity})
    assert reply.status_code == 200, reply.text
    return reply.json()["results"]


@pytest.fixture(name="http")
def http_at_root(server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=root(server), timeout=120) as client:
        yield client


def root(server: LocalServer) -> str:
    """The server's root URL (its base_url without /v1)."""
    return server.base_url.removesuffix("/v1")


def post(http: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    reply = http.post(path, json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def nothing_listening() -> str:
    """A base URL on a local port nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def assert_errors(down: str, filter_url: str, *, ask_down: Callable[[], object],
                  ask_down_async: Callable[[], Awaitable[object]],
                  ask_without_key: Callable[[], object]) -> None:
    """What every framework adapter raises, one `RerankEndpointError` each: asked through an
    endpoint at `down` (nothing listens there), in sync and async code, it names the endpoint
    and asks whether the server runs; asked at `filter_url` without the right key, it gives
    the server's HTTP 401 and names the api_key."""
    with pytest.raises(RerankEndpointError, match=f"cannot reach the rerank endpoint "
                       f"{down}/rerank .*is the server running"):
        ask_down()
    with pytest.raises(RerankEndpointError, match="cannot reach"):
        asyncio.run(ask_down_async())
    with pytest.raises(RerankEndpointError, match=f"{filter_url}/rerank refused the request "
                       "with HTTP 401: .*api_key"):
        ask_without_key()
