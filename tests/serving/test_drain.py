"""A graceful drain: SIGTERM to `sieverag serve` (tiny random model) while 16 requests are in
flight. The server stops admitting (a new request gets 503, /health turns 503 so a load
balancer moves on), the 16 finish and are answered, then it exits 0. Also: the drain of a
server started in a thread (`LocalServer.drain`), and its timeout."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)
from tiny_server import ServeProcess

from sieverag.serving.config import LocalServerConfig
from sieverag.serving.local_server import LocalServer

IN_FLIGHT = 16
# Long generations (the tiny model's context is 1,024 tokens), so the 16 are still running
# while the test checks what the draining server answers others.
MAX_TOKENS = 900


def gauge(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return next(sample.value for family in text_string_to_metric_families(text)
                for sample in family.samples if sample.name == name)


def wait_for(check: object, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def completion(model: str, max_tokens: int = MAX_TOKENS) -> dict:
    return {"model": model, "prompt": "Once upon a time", "max_tokens": max_tokens,
            "temperature": 0}


def test_sigterm_during_16_requests_answers_all_16_and_exits_0(tiny_model_dir: Path) -> None:
    served = ServeProcess(["--engine", "local", "--model", str(tiny_model_dir), "--port", "0",
                           "--no-local.access-log", "--drain-timeout-s", "300"])
    process = served.process
    try:
        announced = served.announced(timeout_s=600)  # loading is slow on a busy machine
        url = announced["url"]
        base = url.removesuffix("/v1")
        model = str(tiny_model_dir)
        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            answers = [pool.submit(httpx.post, f"{url}/completions", json=completion(model),
                                   timeout=600) for _ in range(IN_FLIGHT)]
            wait_for(lambda: gauge(base, "sieverag:num_sequences_running") == IN_FLIGHT)
            assert gauge(base, "sieverag:requests_in_flight") == IN_FLIGHT
            process.send_signal(signal.SIGTERM)
            wait_for(lambda: httpx.get(f"{base}/health").status_code == 503)
            assert httpx.get(f"{base}/health").json() == {"status": "draining"}
            refused = httpx.post(f"{url}/completions", json=completion(model, 1), timeout=60)
            # Checked while the 16 still run: the drain has not ended before them.
            assert not any(answer.done() for answer in answers)
            assert gauge(base, "sieverag:draining") == 1
            replies = [answer.result() for answer in answers]
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        assert [r.status_code for r in replies] == [200] * IN_FLIGHT, replies[0].text
        texts = {r.json()["choices"][0]["text"] for r in replies}
        assert len(texts) == 1 and texts != {""}  # the same greedy answer, whole
        assert process.wait(timeout=120) == 0
    finally:
        served.kill()
    log = served.log
    assert "draining: new requests get 503; 16 request(s) in flight" in log, log
    assert "drained: every request in flight was answered" in log, log


def test_a_drain_that_times_out_cancels_what_is_left(tiny_model_dir: Path) -> None:
    """`LocalServer.drain()` on a server in a thread: new requests get 503 at once; a
    request still running when drain_timeout_s has passed is cancelled, and the server stops
    serving."""
    config = LocalServerConfig(model=str(tiny_model_dir), port=0, access_log=False,
                               drain_timeout_s=10)
    with LocalServer(config) as server, ThreadPoolExecutor(1) as pool:
        base = server.base_url.removesuffix("/v1")
        # Held before its first pass: it cannot finish within the drain's timeout.
        gate = threading.Event()
        # `_prefill`, looked up at each call (the idle worker has already fetched _prefill_all).
        prefill = server.engine._prefill
        server.engine._prefill = lambda *a, **k: (gate.wait(), prefill(*a, **k))
        try:
            running = pool.submit(httpx.post, f"{server.base_url}/completions",
                                  json=completion(server.engine.served.name, 2), timeout=60)
            wait_for(lambda: gauge(base, "sieverag:requests_in_flight") == 1)
            server.drain()
            assert httpx.get(f"{base}/health").status_code == 503
            refused = httpx.post(f"{server.base_url}/completions", timeout=60,
                                 json=completion(server.engine.served.name, 2))
            assert refused.status_code == 503, refused.text
            assert server._thread is not None
            server._thread.join(timeout=60)
            assert not server._thread.is_alive()  # it stopped serving, the request cut off
            try:
                outcome: object = running.result(timeout=60).status_code
            except httpx.HTTPError as error:
                outcome = type(error).__name__
            assert outcome != 200
        finally:
            gate.set()
