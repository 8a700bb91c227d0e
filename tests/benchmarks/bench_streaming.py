"""Streaming from the embedded server: time to the first token, with 1 and with 16 clients,
against the latency of the same requests unstreamed, side by side in one run.

The server is `sieverag serve --engine local` (embedded SmolLM2-135M-Instruct, its default
settings) in a process of its own; the clients are the `openai` SDK's `AsyncOpenAI` here.
Requests: chat completions of ~100-token prompts, max_tokens 32, greedy (as
bench_server.py's generation requests). Each request is sent both ways, alternating in rounds
of 16 (which way goes first alternates too), so load from other processes weighs on both.

  ttft        seconds from sending a streamed request until its first piece of text arrives
              (the first chunk whose `delta.content` is not empty).
  stream      seconds until the streamed reply's last event ([DONE]).
  unstreamed  seconds until the unstreamed reply arrives.

Every streamed reply's text must equal its unstreamed twin's (`agreement`).

    python tests/benchmarks/bench_streaming.py [--quick] [--requests 64]

The default (64 requests each way at each client count) takes about 3 minutes on 2 CPU
cores; `--quick` (16) under a minute besides the server's start.

Prints a table, then one line of JSON with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from offline_env import run_offline

run_offline()

import openai  # noqa: E402
from bench_filter_anywhere import start_server, wait_ready  # noqa: E402
from bench_server import generation_requests  # noqa: E402
from bench_server_abuse import stop_server  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from sieverag.inference.llm.model_resolution import DEFAULT_MODEL, resolve_model  # noqa: E402

ROUND = 16


@dataclass
class Timings:
    ttft: list[float] = field(default_factory=list)
    stream: list[float] = field(default_factory=list)
    unstreamed: list[float] = field(default_factory=list)
    texts: dict[int, tuple[str, str]] = field(default_factory=dict)


async def streamed(client: openai.AsyncOpenAI, body: dict[str, Any]) -> tuple[float, float, str]:
    started = time.perf_counter()
    first = None
    pieces: list[str] = []
    stream = await client.chat.completions.create(**body, stream=True)
    async for chunk in stream:
        text = chunk.choices[0].delta.content if chunk.choices else None
        if text and first is None:
            first = time.perf_counter() - started
        pieces.append(text or "")
    total = time.perf_counter() - started
    return (total if first is None else first), total, "".join(pieces)


async def unstreamed(client: openai.AsyncOpenAI, body: dict[str, Any]) -> tuple[float, str]:
    started = time.perf_counter()
    reply = await client.chat.completions.create(**body)
    return time.perf_counter() - started, reply.choices[0].message.content or ""


async def run(base_url: str, bodies: list[dict[str, Any]], clients: int,
              timings: Timings, offset: int) -> None:
    """Send `bodies` both ways with `clients` requests in flight, alternating in rounds."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0,
                                  timeout=600) as client:
        slots = asyncio.Semaphore(clients)

        async def one_streamed(index: int, body: dict[str, Any]) -> None:
            async with slots:
                ttft, total, text = await streamed(client, body)
            timings.ttft.append(ttft)
            timings.stream.append(total)
            timings.texts[index] = (text, timings.texts.get(index, ("", ""))[1])

        async def one_unstreamed(index: int, body: dict[str, Any]) -> None:
            async with slots:
                latency, text = await unstreamed(client, body)
            timings.unstreamed.append(latency)
            timings.texts[index] = (timings.texts.get(index, ("", ""))[0], text)

        for number, start in enumerate(range(0, len(bodies), ROUND)):
            batch = list(enumerate(bodies[start:start + ROUND], start=offset + start))
            ways = [one_streamed, one_unstreamed]
            for way in ways if number % 2 == 0 else reversed(ways):
                await asyncio.gather(*(way(index, body) for index, body in batch))


def percentile_ms(values: list[float], q: int) -> float:
    if len(values) < 2:
        return 1000 * values[0]
    return 1000 * statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests: about a minute")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests each way at each client count (default 64; --quick 16)")
    args = parser.parse_args()
    count = args.requests or (16 if args.quick else 64)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))
    requests = generation_requests(tokenizer, 2 * count + 2, prompt_tokens=100, max_tokens=32)
    bodies = [body for _, body in requests]
    server = start_server(0, "--model", DEFAULT_MODEL)
    results: dict[int, Timings] = {}
    try:
        wait_ready(server)
        asyncio.run(run(server.base_url, bodies[:2], 2, Timings(), 0))  # warm-up
        for number, clients in enumerate((1, 16)):
            log(f"{count} requests each way, {clients} client(s) ...")
            results[clients] = Timings()
            start = 2 + number * count
            asyncio.run(run(server.base_url, bodies[start:start + count], clients,
                            results[clients], start))
    finally:
        stop_server(server)

    figures: dict[str, Any] = {}
    rows = []
    agree = total = 0
    for clients, timings in results.items():
        for name, values in (("ttft", timings.ttft), ("stream", timings.stream),
                             ("unstreamed", timings.unstreamed)):
            p50, p95 = percentile_ms(values, 50), percentile_ms(values, 95)
            rows.append(f"{clients:>7} {name:<11} {p50:>9.0f} {p95:>9.0f}")
            figures.update({f"{name}_p50_ms_c{clients}": round(p50, 1),
                            f"{name}_p95_ms_c{clients}": round(p95, 1)})
        figures[f"ttft_share_of_unstreamed_c{clients}"] = round(
            statistics.median(timings.ttft) / statistics.median(timings.unstreamed), 3)
        agree += sum(s == u for s, u in timings.texts.values())
        total += len(timings.texts)
    figures["agreement"] = f"{agree}/{total}"
    print(f"streaming from the embedded server, {DEFAULT_MODEL}, chat, ~100-token prompts, "
          f"32 new tokens, {os.cpu_count()} CPU(s)")
    print(f"{'clients':>7} {'seconds to':<11} {'p50 ms':>9} {'p95 ms':>9}")
    print("\n".join(rows))
    for clients in results:
        print(f"{clients} client(s): median time to first token = "
              f"{figures[f'ttft_share_of_unstreamed_c{clients}']:.2f} x the unstreamed "
              "median latency")
    print(f"streamed text equal to unstreamed: {agree}/{total}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
