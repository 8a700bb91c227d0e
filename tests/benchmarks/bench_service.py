"""The embedded server as a service under load: rerank and filtering-proxy traffic at increasing
concurrency, against its concurrency limit, its metrics checked against the client's counts.

Starts `sieverag serve --engine local` in its own process (default: a tiny random Llama with
SmolLM2's tokenizer and a random LoRA adapter as the filter, built in a temporary folder, so
the figures measure the server rather than the model; `--model smollm2-135m-instruct` serves
the embedded model with the shipped filter), with `--proxy-to` a scripted generator in this
process that answers after `--generator-s` seconds (as a real generator takes time), and the
default `--local.max-concurrent-requests` of 512. For each kind of traffic (`rerank`: POST
/v1/rerank of 4 passages; `proxy`: POST /v1/chat/completions marking 4 passages) and each
concurrency level (1, 16, 64, 256, 600) it sends one wave of that many requests at once and
reports: requests answered per second, p50/p99 latency of those answered, refusals (429,
each checked for `Retry-After`), errors among the admitted (any other status), the server's
resident memory (its peak while the wave ran), and the server's own counts from GET /metrics
(requests by status, passages filtered, proxy tokens saved) against the client's.

Goals: the metrics' counts equal the client's; at 600 with the limit of 512, 88 refusals,
0 errors among the admitted, and resident memory within 10 % between 256 and 600.

    python tests/benchmarks/bench_service.py [--quick] [--model tiny|NAME_OR_DIR]
        [--levels 1,16,64,256,600] [--waves N] [--generator-s S]

`--quick` sends one wave per level (the default sends `--waves`, 3). Prints a table, then one
line of JSON with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' helpers

import httpx  # noqa: E402
import psutil  # noqa: E402
import results_json  # noqa: E402
from fake_openai_server import FakeOpenAIServer, Reply, chat_reply  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME  # noqa: E402

ANNOUNCED = re.compile(r"serving .+ at (?P<url>http://127\.0\.0\.1:\d+/v1)")
LIMIT = 512
LEVELS = (1, 16, 64, 256, 600)
QUESTION = "Where was Liora Tamsin born?"
PASSAGES = [
    "Liora Tamsin was born in Quorrin in 1848. She later worked as a cartographer.",
    "Penguins huddle together in winter. They take turns at the edge of the group.",
    "Quorrin is a port town. Liora Tamsin grew up there and drew its harbour.",
    "Tea is grown on terraced hills. The leaves are picked by hand in spring.",
]
ROUTES = {"rerank": "/v1/rerank", "proxy": "/v1/chat/completions"}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class Server:
    process: subprocess.Popen[str]
    url: str  # the OpenAI base URL, .../v1
    output: deque[str]

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")

    def rss_mb(self) -> float:
        try:
            return psutil.Process(self.process.pid).memory_info().rss / 2**20
        except psutil.Error:
            return float("nan")


def tiny_filter(folder: Path) -> tuple[str, str]:
    """The tiny random model and a random LoRA adapter on it (tests' helpers)."""
    from tiny_adapter import make_lora_adapter
    from tiny_model import save_tiny_model

    model = save_tiny_model(folder / "model")
    return str(model), str(make_lora_adapter(model, folder / "adapter"))


def start_server(model: str, adapter: str, upstream: str) -> Server:
    command = [sys.executable, "-m", "sieverag", "serve", "--engine", "local", "--model", model,
               "--adapters", f"filter={adapter}", "--port", "0", "--no-local.access-log",
               "--proxy-to", upstream, "--local.rerank.always-score-chunks",
               "--local.max-concurrent-requests", str(LIMIT)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    output: deque[str] = deque(maxlen=200)
    found = threading.Event()
    url: list[str] = []

    def read() -> None:
        for line in process.stdout:
            output.append(line)
            if not found.is_set() and (match := ANNOUNCED.search(line)):
                url.append(match["url"])
                found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(600) or process.poll() is not None:
        process.kill()
        sys.exit("the server did not start:\n" + "".join(output))
    return Server(process, url[0], output)


def stop_server(server: Server) -> int:
    server.process.send_signal(signal.SIGTERM)  # drains: nothing is in flight by now
    try:
        return server.process.wait(120)
    except subprocess.TimeoutExpired:
        server.process.kill()
        return server.process.wait(30)


def scrape(server: Server) -> Samples:
    text = httpx.get(f"{server.root}/metrics", timeout=60).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def body_of(kind: str, index: int) -> dict[str, Any]:
    question = f"{QUESTION} ({index})"  # no two requests alike
    if kind == "rerank":
        return {"model": "filter", "query": question, "documents": PASSAGES}
    return {"model": "generator", "max_tokens": 8, "documents": PASSAGES,
            "messages": [{"role": "user", "content": question}]}


@dataclass
class Wave:
    kind: str
    level: int
    seconds: float
    latencies: list[float]
    statuses: list[int]
    retry_after: int  # refusals that carried Retry-After
    tokens_saved: int  # proxy: the `sieverag` fields' prompt_tokens_saved, summed
    rss_peak_mb: float
    metrics: dict[str, float]

    @property
    def answered(self) -> int:
        return self.statuses.count(200)

    @property
    def refused(self) -> int:
        return self.statuses.count(429)

    @property
    def errors(self) -> int:
        return len(self.statuses) - self.answered - self.refused

    def client_counts(self) -> dict[str, float]:
        counts = {"requests": len(self.statuses), "200": self.answered, "429": self.refused,
                  "passages": self.answered * len(PASSAGES)}
        if self.kind == "proxy":
            counts["tokens_saved"] = self.tokens_saved
        return counts

    @property
    def counts_match(self) -> bool:
        return self.client_counts() == self.metrics


def percentile(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def send_wave(server: Server, kind: str, level: int) -> Wave:
    """`level` requests of `kind` sent at once; the server's metrics read before and after."""
    before = await asyncio.to_thread(scrape, server)
    peak = [server.rss_mb()]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.05):
            peak.append(server.rss_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    limits = httpx.Limits(max_connections=level, max_keepalive_connections=level)
    async with httpx.AsyncClient(limits=limits, timeout=900) as client:
        async def one(index: int) -> tuple[float, httpx.Response]:
            started = time.monotonic()
            reply = await client.post(server.url + ROUTES[kind].removeprefix("/v1"),
                                      json=body_of(kind, index))
            return time.monotonic() - started, reply

        started = time.monotonic()
        replies = await asyncio.gather(*(one(i) for i in range(level)))
        seconds = time.monotonic() - started
    sampling.set()
    sampler.join()
    after = await asyncio.to_thread(scrape, server)
    route = ROUTES[kind]
    statuses = [reply.status_code for _, reply in replies]
    endpoint = "rerank" if kind == "rerank" else "proxy"
    metrics = {
        "requests": sum(moved(before, after, "sieverag:http_requests_total", route=route,
                              status=str(s)) for s in set(statuses)),
        "200": moved(before, after, "sieverag:http_requests_total", route=route, status="200"),
        "429": moved(before, after, "sieverag:http_requests_total", route=route, status="429"),
        "passages": moved(before, after, "sieverag:filter_passages_total", endpoint=endpoint)}
    saved = 0
    if kind == "proxy":
        metrics["tokens_saved"] = moved(before, after, "sieverag:proxy_prompt_tokens_saved_total")
        saved = sum(r.json()["sieverag"]["prompt_tokens_saved"] for _, r in replies
                    if r.status_code == 200)
    return Wave(kind, level, seconds, [t for t, r in replies if r.status_code == 200],
                statuses, sum(1 for _, r in replies
                              if r.status_code == 429 and r.headers.get("retry-after")),
                saved, max(peak), metrics)


def row(wave: Wave) -> str:
    return (f"| {wave.kind} | {wave.level} | {wave.answered} | {wave.refused} | {wave.errors} | "
            f"{wave.answered / wave.seconds:.1f} | {percentile(wave.latencies, 50):.2f} | "
            f"{percentile(wave.latencies, 99):.2f} | {wave.rss_peak_mb:.0f} | "
            f"{'yes' if wave.counts_match else 'NO ' + json.dumps(wave.metrics)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one wave per level")
    parser.add_argument("--model", default="tiny",
                        help="tiny (a random 2-layer Llama and LoRA, built here) or an embedded "
                             "model name or folder, served with the shipped filter")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)))
    parser.add_argument("--waves", type=int, default=3, help="waves per level (not --quick)")
    parser.add_argument("--generator-s", type=float, default=1.0,
                        help="seconds the scripted generator takes to answer the proxy")
    results_json.add_option(parser)
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    levels = [int(level) for level in args.levels.split(",")]
    waves = 1 if args.quick else args.waves
    started = time.monotonic()
    reply = Reply(body=chat_reply("an answer"), delay_s=args.generator_s)
    with tempfile.TemporaryDirectory(prefix="bench-service-") as folder, \
            FakeOpenAIServer(lambda _: reply) as upstream:
        model, adapter = (tiny_filter(Path(folder)) if args.model == "tiny"
                          else (args.model, DEFAULT_FILTER_NAME))
        server = start_server(model, adapter, upstream.base_url)
        results: list[Wave] = []
        try:
            for kind, route in ROUTES.items():  # warm up (the dense encoder loads on first use)
                httpx.post(server.root + route, json=body_of(kind, -1), timeout=900)
            print("| traffic | concurrency | answered | 429 | errors | answered/s | p50 s | "
                  "p99 s | RSS peak MB | metrics = client |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
            for kind in ROUTES:
                for level in levels:
                    for _ in range(waves):
                        results.append(asyncio.run(send_wave(server, kind, level)))
                        print(row(results[-1]), flush=True)
        finally:
            exit_code = stop_server(server)
    print(f"model {args.model}; limit {LIMIT}; generator {args.generator_s} s; "
          f"{time.monotonic() - started:.0f} s in all; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    summary: dict[str, Any] = {"model": args.model, "limit": LIMIT, "levels": levels,
                               "waves_per_level": waves,
                               "load_average_at_start": round(load_at_start, 2),
                               "server_exit_code": exit_code,
                               "counts_match": all(w.counts_match for w in results),
                               "errors_among_admitted": sum(w.errors for w in results)}
    for kind in ROUTES:
        mine = [w for w in results if w.kind == kind]
        summary[kind] = {str(level): {
            "answered_per_s": round(statistics.mean(w.answered / w.seconds for w in at), 2),
            "p50_s": round(percentile([t for w in at for t in w.latencies], 50), 3),
            "p99_s": round(percentile([t for w in at for t in w.latencies], 99), 3),
            "refusals": [w.refused for w in at],
            "refusals_with_retry_after": [w.retry_after for w in at],
            "errors": sum(w.errors for w in at),
            "rss_peak_mb": round(max(w.rss_peak_mb for w in at), 1)}
            for level in levels if (at := [w for w in mine if w.level == level])}
        if {256, 600} <= set(levels):
            summary[kind]["rss_600_over_256"] = round(
                summary[kind]["600"]["rss_peak_mb"] / summary[kind]["256"]["rss_peak_mb"], 3)
    print(json.dumps(summary))
    if args.results_json:
        results_json.write(args.results_json, {"main": results_table(results)})


def results_table(waves: list[Wave]) -> dict[str, Any]:
    """docs/results/serving.md's load table: a row per wave."""
    return results_json.table(
        ["traffic", "concurrency", "answered", "429 (all with Retry-After)", "errors",
         "answered/s", "p50 s", "p99 s", "server RSS peak MB", "/metrics = client"],
        [[w.kind, w.level, w.answered, w.refused, w.errors, w.answered / w.seconds,
          percentile(w.latencies, 50), percentile(w.latencies, 99), w.rss_peak_mb,
          "yes" if w.counts_match and w.retry_after == w.refused else "NO"] for w in waves],
        align=["left"] + ["right"] * 8 + ["left"],
        formats=[None, None, None, None, None, ".1f", ".2f", ".2f", ".0f", None])


if __name__ == "__main__":
    main()
