"""Embedded server throughput: 16 concurrent clients against 1 sequential client, and a load run.

The server (`serving.local_server`, embedded SmolLM2-135M-Instruct, default settings) runs in
its own process on 127.0.0.1; clients are asyncio tasks on one httpx connection pool here.

(a) Generation: /v1/chat/completions, ~100-token prompts, max_tokens=32, greedy. The same
    requests (128; 16 with --quick) sent by 1 client one after another and by 16 clients at
    once, alternating in rounds of 16 so that load from other processes weighs on both
    alike: requests/s, p50/p95 latency, and `ratio` = concurrent / sequential requests/s
    (target >= 3: the decode steps of concurrent requests run as one batch).
(b) Scoring: /v1/completions, ~300-token prompts, max_tokens=1, logprobs=5, same comparison
    (`scoring_ratio`, no target: on a CPU these are prefill-bound and batching helps little).
(c) Load: 1,000 mixed requests (128 with --quick; short chat generations and scoring
    requests) from 32 clients: errors (non-200 or malformed bodies), dropped requests (no
    reply at all) and the server's RSS before and after.

    python tests/benchmarks/bench_server.py [--quick] [--port 8765]

Prints a table, then one line of JSON with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import psutil  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from sieverag.inference.llm.model_resolution import DEFAULT_MODEL, resolve_model  # noqa: E402

SERVER = """
import logging, sys
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.local_server import LocalServer
logging.basicConfig(level=logging.INFO)
LocalServer(LocalServerConfig(model=sys.argv[1], port=int(sys.argv[2]), access_log=False,
                              log_level="warning")).run()
"""

TOPICS = ["the water cycle", "photosynthesis", "the French revolution", "volcanoes",
          "the immune system", "black holes", "the printing press", "honey bees",
          "ocean tides", "the Roman empire", "electric motors", "coral reefs",
          "the human heart", "glaciers", "the silk road", "solar panels"]
SENTENCES = ["{t} has been studied for a long time by many researchers around the world.",
             "Scholars still debate several details about {t} and its consequences.",
             "A clear explanation of {t} helps students understand related ideas.",
             "Recent work on {t} used new measurements and careful comparisons.",
             "Teachers often introduce {t} with simple examples and diagrams.",
             "Popular books describe {t} in plain words for a general audience."]


def padded_text(tokenizer: Any, seed: int, target_tokens: int) -> str:
    """Sentences about one topic, added until the text holds `target_tokens` tokens."""
    topic = TOPICS[seed % len(TOPICS)]
    parts: list[str] = []
    n = seed
    while len(tokenizer(" ".join(parts))["input_ids"]) < target_tokens:
        parts.append(SENTENCES[n % len(SENTENCES)].format(t=topic).capitalize())
        n += 1
    return " ".join(parts)


def generation_requests(tokenizer: Any, count: int, prompt_tokens: int, max_tokens: int
                        ) -> list[tuple[str, dict]]:
    """Chat requests whose rendered prompts hold about `prompt_tokens` tokens."""
    template = tokenizer.apply_chat_template([{"role": "user", "content": ""}],
                                             add_generation_prompt=True, tokenize=False)
    overhead = len(tokenizer(template, add_special_tokens=False)["input_ids"])
    requests = []
    for i in range(count):
        content = f"Question {i}: summarise this. " + padded_text(tokenizer, i,
                                                                   prompt_tokens - overhead - 8)
        requests.append(("/v1/chat/completions", {
            "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0}))
    return requests


def scoring_requests(tokenizer: Any, count: int, prompt_tokens: int) -> list[tuple[str, dict]]:
    return [("/v1/completions", {
        "model": DEFAULT_MODEL, "prompt": f"Document {i}. " + padded_text(tokenizer, i,
                                                                         prompt_tokens - 4)
        + "\nIs this document relevant? Answer:", "max_tokens": 1, "logprobs": 5,
        "temperature": 0}) for i in range(count)]


def valid_body(path: str, body: Any) -> bool:
    """The reply holds what the request asked for."""
    try:
        choice = body["choices"][0]
        if path == "/v1/completions":
            return len(choice["logprobs"]["top_logprobs"][0]) >= 5
        content = choice["message"]["content"]
        return isinstance(content, str) and body["usage"]["completion_tokens"] > 0
    except (KeyError, IndexError, TypeError):
        return False


@dataclass
class RunResult:
    seconds: float
    latencies: list[float]
    errors: int
    dropped: int

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds

    def percentile_ms(self, q: float) -> float:
        if len(self.latencies) < 2:
            return 1000 * (self.latencies[0] if self.latencies else float("nan"))
        return 1000 * statistics.quantiles(self.latencies, n=100, method="inclusive")[int(q) - 1]


async def run_clients(base: str, requests: list[tuple[str, dict]], clients: int) -> RunResult:
    """`clients` tasks take the requests in order, each sending its next one when its last
    reply has arrived."""
    pending = list(reversed(requests))
    latencies: list[float] = []
    errors = dropped = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as http:
        async def client() -> None:
            nonlocal errors, dropped
            while pending:
                path, body = pending.pop()
                started = time.perf_counter()
                try:
                    response = await http.post(path, json=body)
                except httpx.HTTPError:
                    dropped += 1
                    continue
                latencies.append(time.perf_counter() - started)
                if response.status_code != 200 or not valid_body(path, response.json()):
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
    return RunResult(time.perf_counter() - started, latencies, errors, dropped)


def start_server(port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", SERVER, DEFAULT_MODEL, str(port)])
    deadline = time.monotonic() + 300
    while True:
        if process.poll() is not None:
            sys.exit(f"the server exited with code {process.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            sys.exit("the server did not start within 300 s")
        time.sleep(0.5)


def compare(base: str, requests: list[tuple[str, dict]], clients: int, label: str,
            rows: list[str], figures: dict[str, Any], prefix: str,
            log: Callable[[str], None]) -> float:
    """Run `requests` by 1 client and by `clients` clients, alternating in rounds of
    `clients` requests (which mode goes first alternates too), so load from other processes
    weighs on both alike. Returns the ratio of requests/s."""
    runs: dict[str, list[RunResult]] = {"sequential": [], "concurrent": []}
    rounds = [requests[i:i + clients] for i in range(0, len(requests), clients)]
    for number, batch in enumerate(rounds):
        log(f"{label}: round {number + 1}/{len(rounds)}, {len(batch)} requests, 1 client and "
            f"{clients} clients")
        order = [("sequential", 1), ("concurrent", clients)]
        for mode, n_clients in order if number % 2 == 0 else reversed(order):
            runs[mode].append(asyncio.run(run_clients(base, batch, n_clients)))
    sequential, concurrent = (combined(runs["sequential"]), combined(runs["concurrent"]))
    ratio = concurrent.rps / sequential.rps
    for name, run in (("1 client", sequential), (f"{clients} clients", concurrent)):
        rows.append(f"{label:<11} {name:<11} {run.rps:>8.2f} {run.percentile_ms(50):>9.0f} "
                    f"{run.percentile_ms(95):>9.0f} {run.errors + run.dropped:>7}")
    for mode, run in (("sequential", sequential), ("concurrent", concurrent)):
        figures.update({f"{prefix}_rps_{mode}": round(run.rps, 3),
                        f"{prefix}_p50_ms_{mode}": round(run.percentile_ms(50), 1),
                        f"{prefix}_p95_ms_{mode}": round(run.percentile_ms(95), 1)})
    figures[f"{prefix}_errors"] = sum(r.errors + r.dropped for r in (sequential, concurrent))
    return ratio


def combined(runs: list[RunResult]) -> RunResult:
    return RunResult(sum(r.seconds for r in runs), [t for r in runs for t in r.latencies],
                     sum(r.errors for r in runs), sum(r.dropped for r in runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests: under a minute")
    parser.add_argument("--port", type=int, default=8765, help="server port on 127.0.0.1")
    args = parser.parse_args()
    n_generation, n_scoring, n_load = (16, 16, 128) if args.quick else (128, 128, 1000)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))
    generation = generation_requests(tokenizer, n_generation, prompt_tokens=100, max_tokens=32)
    scoring = scoring_requests(tokenizer, n_scoring, prompt_tokens=300)
    load = [r for pair in zip(generation_requests(tokenizer, n_load // 2, 40, 8),
                              scoring_requests(tokenizer, n_load // 2, 40), strict=True)
            for r in pair]
    server = start_server(args.port)
    base = f"http://127.0.0.1:{args.port}"
    try:
        asyncio.run(run_clients(base, generation[:2] + scoring[:2], 2))  # warm-up
        rows: list[str] = []
        figures: dict[str, Any] = {}
        figures["ratio"] = round(compare(base, generation, 16, "generation", rows, figures,
                                         "gen", log), 2)
        figures["scoring_ratio"] = round(compare(base, scoring, 16, "scoring", rows, figures,
                                                 "scoring", log), 2)
        rss_before = psutil.Process(server.pid).memory_info().rss / 2**20
        log(f"load: {len(load)} requests, 32 clients ...")
        loaded = asyncio.run(run_clients(base, load, 32))
        rss_after = psutil.Process(server.pid).memory_info().rss / 2**20
        alive = httpx.get(f"{base}/health").status_code == 200
    finally:
        server.terminate()
        server.wait(60)
    figures.update({
        "load_requests": len(load), "load_rps": round(loaded.rps, 2),
        "load_errors": loaded.errors, "load_dropped": loaded.dropped,
        "load_rss_before_mb": round(rss_before, 1), "load_rss_after_mb": round(rss_after, 1),
        "load_rss_growth_mb": round(rss_after - rss_before, 1), "server_alive_after": alive,
    })
    print(f"embedded server, {DEFAULT_MODEL}, {os.cpu_count()} CPU(s)")
    print(f"{'requests':<11} {'clients':<11} {'req/s':>8} {'p50 ms':>9} {'p95 ms':>9} "
          f"{'errors':>7}")
    print("\n".join(rows))
    print(f"generation ratio (16 clients / 1): {figures['ratio']:.2f}x (target >= 3)")
    print(f"scoring ratio (16 clients / 1):    {figures['scoring_ratio']:.2f}x (no target)")
    print(f"load: {len(load)} requests at 32 clients, {loaded.rps:.1f} req/s, "
          f"{loaded.errors} errors, {loaded.dropped} dropped, RSS {rss_before:.0f} -> "
          f"{rss_after:.0f} MiB")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
