"""Backpressure on the embedded server (tiny random model): past --local.max-concurrent-requests
(512, TEI's default) a request is answered 429 with Retry-After at once, never queued; the
requests admitted all answer correctly; a stream holds its slot while it lasts.

The engine is held at a gate (its worker waits before its first prefill pass), so exactly the
limit's worth of requests are in flight when the rest arrive; the gate opens once the server's
own metrics (/metrics is never limited) show them all there."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

from sieverag.serving.config import LocalServerConfig
from sieverag.serving.local_server import LocalServer

LIMIT, CLIENTS = 512, 600
PROMPT = "The river carried small boats past old mills"


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[LocalServer]:
    with LocalServer(LocalServerConfig(model=str(tiny_model_dir), port=0, access_log=False,
                                       max_concurrent_requests=LIMIT)) as running:
        yield running


def gate(monkeypatch: pytest.MonkeyPatch, server: LocalServer, step: str) -> threading.Event:
    """Hold the engine's worker before its next `step` ("_prefill" or "_decode_step": methods
    the worker looks up at each call, unlike `_prefill_all`, which its idle loop has already
    fetched) until the returned event is set."""
    engine = server.engine
    run = getattr(engine, step)
    opened = threading.Event()

    def held(*args: object, **kwargs: object) -> None:
        opened.wait()
        run(*args, **kwargs)

    monkeypatch.setattr(engine, step, held)
    return opened


def gauges(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if not sample.labels}


def wait_for(base: str, name: str, wanted: float, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while (seen := gauges(base).get(name)) != wanted:
        assert time.monotonic() < deadline, f"{name} is {seen}, not {wanted}"
        time.sleep(0.2)


def completion(server: LocalServer, **fields: object) -> dict:
    return {"model": server.engine.served.name, "prompt": PROMPT, "max_tokens": 2,
            "temperature": 0, **fields}


def test_600_requests_against_a_limit_of_512_give_88_refusals(
        server: LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:
    base = server.base_url.removesuffix("/v1")
    expected = httpx.post(f"{server.base_url}/completions", json=completion(server),
                          timeout=60).json()["choices"][0]["text"]
    rss_before = psutil.Process().memory_info().rss
    opened = gate(monkeypatch, server, "_prefill")

    async def flood() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
        async with httpx.AsyncClient(limits=limits, timeout=600) as client:
            tasks = [asyncio.create_task(client.post(f"{server.base_url}/completions",
                                                     json=completion(server)))
                     for _ in range(CLIENTS)]
            # The refusals come back while the admitted requests wait at the gate.
            deadline = time.monotonic() + 600  # a busy machine accepts 600 connections slowly
            while (done := sum(t.done() for t in tasks)) < CLIENTS - LIMIT:
                assert time.monotonic() < deadline, f"{done} of the refusals came back"
                await asyncio.sleep(0.2)
            await asyncio.to_thread(wait_for, base, "sieverag:requests_in_flight", LIMIT)
            # Every admitted request is queued on the engine, none refused or lost.
            await asyncio.to_thread(wait_for, base, "sieverag:num_sequences_waiting", LIMIT)
            assert sum(t.done() for t in tasks) == CLIENTS - LIMIT
            opened.set()
            return list(await asyncio.gather(*tasks))

    try:
        replies = asyncio.run(flood())
    finally:
        opened.set()  # a failure must not leave the engine's worker held (its close joins it)
    refused = [r for r in replies if r.status_code == 429]
    accepted = [r for r in replies if r.status_code != 429]
    assert len(refused) == CLIENTS - LIMIT == 88
    assert all(r.headers["retry-after"] == "1" for r in refused)
    assert all(r.json()["error"]["code"] == "overloaded" for r in refused)
    assert all("--local.max-concurrent-requests" in r.json()["error"]["message"]
               for r in refused)
    assert [r.status_code for r in accepted] == [200] * LIMIT
    assert all(r.json()["choices"][0]["text"] == expected for r in accepted)
    wait_for(base, "sieverag:requests_in_flight", 0)
    # The memory the flood left behind is bounded (it is a few MB on the tiny model).
    grown_mb = (psutil.Process().memory_info().rss - rss_before) / 2**20
    assert grown_mb < 256, f"resident memory grew {grown_mb:.0f} MB"


def test_a_stream_holds_its_slot_while_it_lasts(server: LocalServer,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    base = server.base_url.removesuffix("/v1")
    opened = gate(monkeypatch, server, "_decode_step")  # the first token comes, then it waits
    with httpx.stream("POST", f"{server.base_url}/completions", timeout=60,
                      json=completion(server, stream=True, max_tokens=3)) as reply:
        lines = reply.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        try:
            assert gauges(base)["sieverag:requests_in_flight"] == 1
        finally:
            opened.set()
        assert [line for line in lines if line.startswith("data: ")][-1] == "data: [DONE]"
    wait_for(base, "sieverag:requests_in_flight", 0)
    # /health and /metrics are not counted, and answer whatever the load.
    assert httpx.get(f"{base}/health").status_code == 200
