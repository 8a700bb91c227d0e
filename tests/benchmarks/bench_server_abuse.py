"""Abusive requests against a live embedded server: does one client hurt the others?

Starts `sieverag serve --engine local` (the embedded SmolLM2-135M-Instruct, or any local model
folder with --model) on a free port in its own process, then replays each case below while a
separate process polls GET /health every 50 ms. For each case: the HTTP status, the /health
latency while it ran (median, 99th percentile, worst), and the server's RSS (the process and
its children) before, after and at its peak.
The first case does nothing: its figures are the baseline the others are read against.

  idle            nothing for 5 s (baseline: /health latency, CPU seconds)
  token_ids_16k   /v1/completions with a prompt of 16,000 token ids (400 expected)
  body_50mb       a 50 MB JSON body (413 expected, refused by its Content-Length)
  chat_108kb      a 108 KB chat message (400 expected: more tokens than the context)
  lone_surrogate  a prompt holding "\\ud800" (400 expected)
  aborted_50      50 long generations whose clients disconnect after 1 s: the server's CPU
                  seconds in the 5 s after (`cpu_s`, against `idle`: abandoned work must
                  stop; `cpu_s_after_1s` leaves out the forward pass under way when they
                  went) and in the second they ran (`running_cpu_s`)
  echo_8k         /v1/completions scoring an 8k-token prompt (echo, logprobs 5, max_tokens 0;
                  the context's size less one when it is smaller; 1k tokens with --quick):
                  RSS peak
  load            1,000 mixed requests (chat generations, scoring, echo, token ids; 50 with
                  --quick) from 32 clients: requests/s, p50/p99 latency, errors

    python tests/benchmarks/bench_server_abuse.py [--quick] [--model NAME_OR_DIR] [--api-key]
        [--cases echo_8k,load]

Prints a table, then one line of JSON with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.client import HTTPResponse
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import psutil  # noqa: E402

from sieverag.inference.llm.model_resolution import DEFAULT_MODEL  # noqa: E402

ANNOUNCED = re.compile(r"serving .+ at (?P<url>http://127\.0\.0\.1:(?P<port>\d+)/v1)")
KEY_VARIABLE = "SIEVERAG_BENCH_API_KEY"
HEALTH_PERIOD_S = 0.05
WINDOW_S = 5.0  # the CPU-seconds windows of `idle` and `aborted_50`
STORY = ("Tell me a long story about a lighthouse keeper, the storms she saw and the ships "
         "she guided home, chapter by chapter.")
WORDS = ("the river carried small boats past old mills and quiet farms while children "
         "counted clouds above the hills ").split()


@dataclass
class Server:
    """The server process, its port and the headers its requests need."""

    process: subprocess.Popen[str]
    port: int
    headers: dict[str, str]
    output: deque[str]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def processes(self) -> list[psutil.Process]:
        try:
            main = psutil.Process(self.process.pid)
            return [main, *main.children(recursive=True)]
        except psutil.Error:  # it has exited: the end of the table says so
            return []

    def request_head(self, path: str, length: int) -> bytes:
        lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
                 f"Content-Length: {length}", *(f"{k}: {v}" for k, v in self.headers.items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def rss_mb(self) -> float:
        return sum(_safe(lambda p=p: p.memory_info().rss) for p in self.processes()) / 2**20

    def cpu_s(self) -> float:
        def used(p: psutil.Process) -> float:
            times = p.cpu_times()
            return times.user + times.system
        return sum(_safe(lambda p=p: used(p)) for p in self.processes())


def _safe(read: Callable[[], float]) -> float:
    """A psutil reading, 0 for a child that ended meanwhile."""
    try:
        return read()
    except psutil.Error:
        return 0


def start_server(model: str, api_key: str | None) -> Server:
    """`sieverag serve` on a free port (--port 0, read back from its announcement)."""
    command = [sys.executable, "-m", "sieverag", "serve", "--engine", "local", "--model", model,
               "--port", "0", "--no-local.access-log"]
    env = dict(os.environ)
    headers = {}
    if api_key is not None:
        command += ["--api-key-env", KEY_VARIABLE]
        env[KEY_VARIABLE] = api_key
        headers["Authorization"] = f"Bearer {api_key}"
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env)
    output: deque[str] = deque(maxlen=200)
    lines: queue.SimpleQueue[str] = queue.SimpleQueue()

    def read() -> None:
        for line in process.stdout:
            output.append(line)
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 300
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            sys.exit("the server did not start:\n" + "".join(output))
        try:
            found = ANNOUNCED.search(lines.get(timeout=0.5))
        except queue.Empty:
            continue
        if found:
            return Server(process, int(found["port"]), headers, output)


def stop_server(server: Server) -> None:
    server.process.send_signal(signal.SIGINT)
    try:
        server.process.wait(30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(30)


def _percentile(values: list[float], q: int) -> float:
    """The q-th percentile (inclusive method); the value itself for one, NaN for none."""
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@dataclass
class Poll:
    started: float
    ended: float


# The /health poller runs in a process of its own: polled from a thread of this one, its
# latency would include waiting for this process's GIL while the load clients parse replies.
# It prints one line per poll: "started ended ok", both on the shared monotonic clock.
POLLER = """
import http.client, sys, time
host, port, period = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
http = http.client.HTTPConnection(host, port, timeout=60)
while True:
    started = time.monotonic()
    try:
        http.request("GET", "/health")
        response = http.getresponse()
        response.read()
        ok = response.status == 200
    except (OSError, http.client.HTTPException):
        ok = False
        http.close()
    ended = time.monotonic()
    print(started, ended, int(ok), flush=True)
    time.sleep(max(0.0, period - (ended - started)))
"""


class HealthWatch:
    """A process polling /health every 50 ms, and the server's RSS read after each poll: the
    worst and median latency and the highest RSS seen while a case runs (a poll that hangs
    counts until it returns)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.polls: list[Poll] = []
        self.cases: dict[str, CaseFigures] = {}
        self.failures = 0
        self.rss_peak = 0.0
        self._polled = threading.Condition()
        self._poller: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> HealthWatch:
        self._poller = subprocess.Popen(
            [sys.executable, "-c", POLLER, "127.0.0.1", str(self.server.port),
             str(HEALTH_PERIOD_S)], stdout=subprocess.PIPE, text=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._poller is not None
        self._poller.kill()
        self._poller.wait()
        self._thread.join()

    def _read(self) -> None:
        assert self._poller is not None and self._poller.stdout is not None
        for line in self._poller.stdout:
            started, ended, ok = line.split()
            self.rss_peak = max(self.rss_peak, self.server.rss_mb())
            with self._polled:
                self.polls.append(Poll(float(started), float(ended)))
                self.failures += ok != "1"
                self._polled.notify_all()

    @contextmanager
    def case(self, name: str, what: str = "") -> Iterator[CaseFigures]:
        """Measure the block as case `name`: worst /health latency, RSS before, after and at
        its peak (kept in `cases`, and logged)."""
        print(f"{name}{': ' + what if what else ''} ...", file=sys.stderr, flush=True)
        figures = CaseFigures(rss_before_mb=self.server.rss_mb())
        self.rss_peak = figures.rss_before_mb
        failures = self.failures
        started = time.monotonic()
        yield figures
        ended = time.monotonic()
        # Polls under way during the case, and the first one after it (a short case may fall
        # between two polls; a server still busy answers that one late).
        with self._polled:
            while not self.polls or self.polls[-1].started <= ended:
                self._polled.wait()
            during = [p for p in self.polls if p.ended >= started]
            figures.health_failures = self.failures - failures
        latencies = sorted(1000 * (p.ended - p.started) for p in during)
        figures.health_worst_ms = latencies[-1]
        figures.health_p50_ms = statistics.median(latencies)
        figures.health_p99_ms = _percentile(latencies, 99)
        figures.rss_after_mb = self.server.rss_mb()
        figures.rss_peak_mb = max(self.rss_peak, figures.rss_after_mb)
        self.cases[name] = figures
        print(f"  {json.dumps(figures.as_json())}", file=sys.stderr, flush=True)


@dataclass
class CaseFigures:
    rss_before_mb: float
    status: int | None = None
    health_worst_ms: float = 0.0
    health_p50_ms: float = 0.0
    health_p99_ms: float = 0.0
    health_failures: int = 0
    rss_after_mb: float = 0.0
    rss_peak_mb: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"status": self.status, "health_worst_ms": round(self.health_worst_ms, 1),
                "health_p50_ms": round(self.health_p50_ms, 1),
                "health_p99_ms": round(self.health_p99_ms, 1),
                "health_failures": self.health_failures,
                "rss_before_mb": round(self.rss_before_mb, 1),
                "rss_after_mb": round(self.rss_after_mb, 1),
                "rss_peak_mb": round(self.rss_peak_mb, 1), **self.extra}


def raw_post(server: Server, path: str, body: bytes, timeout: float = 600) -> int:
    """POST `body` as it is over a socket of its own and return the status. The body is sent
    from a thread while the response is read, so a server that answers before reading it all
    (413) is seen answering."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        def send() -> None:
            try:
                sock.sendall(server.request_head(path, len(body)))
                view = memoryview(body)
                for start in range(0, len(body), 1 << 20):
                    sock.sendall(view[start:start + (1 << 20)])
            except OSError:
                pass  # the server answered and closed; the status is read below

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        response = HTTPResponse(sock)
        response.begin()
        response.read()
        status = response.status
    sender.join(timeout=30)
    return status


def post_json(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.base + path, json=body, headers=server.headers, timeout=600)


def words_text(count: int, seed: int = 0) -> str:
    return " ".join(WORDS[(seed + i) % len(WORDS)] for i in range(count))


def prompt_of_tokens(server: Server, model: str, tokens: int) -> str:
    """A text that the served tokenizer reads as about `tokens` tokens (asked of the server:
    an echo of a short text gives the tokens per word)."""
    probe = words_text(200)
    reply = post_json(server, "/v1/completions", {"model": model, "prompt": probe,
                                                  "max_tokens": 0, "echo": True,
                                                  "logprobs": 0}).json()
    per_word = reply["usage"]["prompt_tokens"] / 200
    return words_text(max(1, int(tokens / per_word) - 2))


def abort_requests(server: Server, model: str, count: int, max_tokens: int,
                   running_s: float) -> None:
    """`count` long generations, each on its own connection, closed after `running_s`."""
    sockets = []
    for i in range(count):
        body = json.dumps({"model": model, "prompt": f"{STORY} ({i})",
                           "max_tokens": max_tokens}).encode()
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        sock.sendall(server.request_head("/v1/completions", len(body)) + body)
        sockets.append(sock)
    time.sleep(running_s)
    for sock in sockets:
        sock.close()


def load_requests(model: str, count: int) -> list[tuple[str, dict[str, Any]]]:
    """Chat generations, scoring (logprobs 5), echo scoring and token-id completions, mixed."""
    kinds: list[Callable[[int], tuple[str, dict[str, Any]]]] = [
        lambda i: ("/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": f"Question {i}: "
                                          + words_text(30, i)}],
            "max_tokens": 8, "temperature": 0}),
        lambda i: ("/v1/completions", {
            "model": model, "prompt": f"Document {i}. {words_text(60, i)}\nRelevant? Answer:",
            "max_tokens": 1, "logprobs": 5, "temperature": 0}),
        lambda i: ("/v1/completions", {
            "model": model, "prompt": words_text(40, i), "max_tokens": 0, "echo": True,
            "logprobs": 0}),
        lambda i: ("/v1/completions", {
            "model": model, "prompt": [100 + (i * 37 + j) % 20_000 for j in range(30)],
            "max_tokens": 4, "temperature": 0}),
    ]
    return [kinds[i % len(kinds)](i) for i in range(count)]


@dataclass
class LoadResult:
    seconds: float
    latencies: list[float]
    errors: int

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds

    def percentile_ms(self, q: int) -> float:
        return 1000 * _percentile(self.latencies, q)


async def run_load(server: Server, requests: list[tuple[str, dict[str, Any]]],
                   clients: int) -> LoadResult:
    """`clients` tasks take the requests in order, each sending its next one when its last
    reply has arrived; an error is a non-200 status or no reply at all."""
    pending = list(reversed(requests))
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=server.base, headers=server.headers, timeout=600,
                                 limits=limits) as http:
        async def client() -> None:
            nonlocal errors
            while pending:
                path, body = pending.pop()
                started = time.perf_counter()
                try:
                    response = await http.post(path, json=body)
                    errors += response.status_code != 200
                except httpx.HTTPError:
                    errors += 1
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
    return LoadResult(time.perf_counter() - started, latencies, errors)


# The cases after `idle` (the baseline, always run), in the order they run.
CASES = ("token_ids_16k", "body_50mb", "chat_108kb", "lone_surrogate", "aborted_50", "echo_8k",
         "load")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="50 load requests and a 1k-token echo: under a minute")
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="embedded model name or local model folder to serve")
    parser.add_argument("--api-key", action="store_true",
                        help="serve with a random API key (--api-key-env) and send it")
    parser.add_argument("--cases", default=",".join(CASES),
                        help="comma-separated cases to run after `idle` (default: all)")
    args = parser.parse_args()
    chosen = {c.strip() for c in args.cases.split(",") if c.strip()}
    if not chosen <= set(CASES):
        parser.error(f"--cases: unknown {sorted(chosen - set(CASES))}; known: {', '.join(CASES)}")
    n_load, echo_tokens = (50, 1000) if args.quick else (1000, 8000)

    print(f"starting the server on {args.model} ...", file=sys.stderr, flush=True)
    server = start_server(args.model, secrets.token_urlsafe(16) if args.api_key else None)
    try:
        listed = httpx.get(server.base + "/v1/models", headers=server.headers, timeout=60)
        model, context = listed.json()["data"][0]["id"], listed.json()["data"][0]["max_model_len"]
        echo_tokens = min(echo_tokens, context - 1)
        with HealthWatch(server) as watch:
            with watch.case("idle", f"{WINDOW_S:.0f} s") as figures:
                cpu = server.cpu_s()
                time.sleep(WINDOW_S)
                figures.extra["cpu_s"] = round(server.cpu_s() - cpu, 2)

            if "token_ids_16k" in chosen:
                with watch.case("token_ids_16k") as figures:
                    figures.status = post_json(server, "/v1/completions", {
                        "model": model, "prompt": [100 + i % 40_000 for i in range(16_000)],
                        "max_tokens": 16}).status_code

            if "body_50mb" in chosen:
                body = json.dumps({"model": model, "prompt": "a" * 50_000_000}).encode()
                with watch.case("body_50mb") as figures:
                    figures.status = raw_post(server, "/v1/completions", body)
                del body

            if "chat_108kb" in chosen:
                with watch.case("chat_108kb") as figures:
                    message = words_text(21_600)[:108_000]
                    figures.status = post_json(server, "/v1/chat/completions", {
                        "model": model, "max_tokens": 16,
                        "messages": [{"role": "user", "content": message}]}).status_code

            if "lone_surrogate" in chosen:
                with watch.case("lone_surrogate") as figures:
                    figures.status = raw_post(server, "/v1/completions", json.dumps(
                        {"model": model, "prompt": "a\ud800b"}).encode())

            if "aborted_50" in chosen:
                with watch.case("aborted_50", "50 generations, disconnected after 1 s"
                                ) as figures:
                    cpu = server.cpu_s()
                    abort_requests(server, model, 50, min(2000, context - 64), running_s=1.0)
                    figures.extra["running_cpu_s"] = round(server.cpu_s() - cpu, 2)
                    cpu = server.cpu_s()
                    time.sleep(1.0)
                    settling = server.cpu_s()
                    time.sleep(WINDOW_S - 1.0)
                    figures.extra["cpu_s"] = round(server.cpu_s() - cpu, 2)
                    figures.extra["cpu_s_after_1s"] = round(server.cpu_s() - settling, 2)

            if "echo_8k" in chosen:
                echo_prompt = prompt_of_tokens(server, model, echo_tokens)
                with watch.case("echo_8k", f"{echo_tokens} tokens") as figures:
                    reply = post_json(server, "/v1/completions", {
                        "model": model, "prompt": echo_prompt, "max_tokens": 0, "echo": True,
                        "logprobs": 5})
                    figures.status = reply.status_code
                    figures.extra["prompt_tokens"] = reply.json().get("usage", {}).get(
                        "prompt_tokens")

            if "load" in chosen:
                with watch.case("load", f"{n_load} mixed requests, 32 clients") as figures:
                    loaded = asyncio.run(run_load(server, load_requests(model, n_load), 32))
                    figures.status = 200 if loaded.errors == 0 else None
                    figures.extra.update({
                        "requests": n_load, "rps": round(loaded.rps, 2),
                        "p50_ms": round(loaded.percentile_ms(50), 1),
                        "p99_ms": round(loaded.percentile_ms(99), 1), "errors": loaded.errors})
        try:
            alive = httpx.get(server.base + "/health", timeout=30).status_code == 200
        except httpx.HTTPError:  # a dead server is the finding, not a crash of the bench
            alive = False
    finally:
        stop_server(server)
    cases = watch.cases

    idle_cpu = cases["idle"].extra["cpu_s"]
    aborted_cpu = cases["aborted_50"].extra["cpu_s"] if "aborted_50" in cases else None
    print(f"embedded server abuse, {args.model}, context {context}, {os.cpu_count()} CPU(s)"
          f"{', API key' if args.api_key else ''}{', --quick' if args.quick else ''}")
    print(f"{'case':<15} {'status':>6} {'/health ms: p50':>16} {'p99':>7} {'worst':>7} "
          f"{'RSS before':>11} "
          f"{'after':>8} {'peak':>8}  notes")
    for name, figures in cases.items():
        notes = dict(figures.extra)
        if figures.health_failures:
            notes["health_failures"] = figures.health_failures
        print(f"{name:<15} {figures.status or '-':>6} {figures.health_p50_ms:>16.1f} "
              f"{figures.health_p99_ms:>7.1f} {figures.health_worst_ms:>7.1f} "
              f"{figures.rss_before_mb:>9.0f}MB {figures.rss_after_mb:>6.0f}MB "
              f"{figures.rss_peak_mb:>6.0f}MB  "
              + ", ".join(f"{k}={v}" for k, v in notes.items()))
    if aborted_cpu is not None:
        print(f"CPU seconds in the {WINDOW_S:.0f} s after 50 aborted generations: "
              f"{aborted_cpu:.2f} (idle: {idle_cpu:.2f})")
    print(f"server alive at the end: {alive}")
    print(json.dumps({"model": args.model, "quick": args.quick, "server_alive_after": alive,
                      "aborted_cpu_s": aborted_cpu, "idle_cpu_s": idle_cpu,
                      "cases": {name: figures.as_json() for name, figures in cases.items()}}))


if __name__ == "__main__":
    main()
