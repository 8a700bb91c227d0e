"""The `openai` backend's client, side by side: the `openai` SDK it uses now against the
hand-written httpx transport it used before, on the same requests in one run.

The old client is the backend as it was at commit OLD_COMMIT (the last with the httpx
transport), read from git history (`git show`) and imported under another name; nothing of
it is kept in the source tree. Both are `OpenAIBackend`s with the same settings, so they
send the same requests; only the transport differs.

  canned     label_logprobs requests/s against a server that answers at once with one fixed
             chat completion (uvicorn, in a process of its own), with 1 and with 16 requests
             in flight (`max_concurrency`), and what each client itself costs: the CPU time
             of this process (the clients alone: the server runs elsewhere) per request.
  filter     documents/s of the shipped filter's chunk stage on the embedded server
             (`sieverag serve --engine local --adapters filter=smollm2-filter`): one
             `label_logprobs` request ("Yes"/"No" of the first reply token) per (question,
             passage) of HotpotQA, built as MCF builds it (`chunk_prompt`), with 1 and 8 in
             flight: the client's share of real work. The two clients' scores must agree.

Each measurement alternates the clients in rounds (old, new, new, old, ...), so load from
other processes weighs on both alike; the ratio column is SDK / old (above 1: the SDK is
faster).

    python tests/benchmarks/bench_openai_client.py [--quick] [--questions 6]

The default (canned: 8 rounds of 256 requests per client count; filter: 6 questions' 60
passages, each scored by both clients at both client counts) takes about 5 minutes on 2 CPU
cores; `--quick` (2 rounds, 2 questions) under a minute besides the server's start.

Prints a table, then one line of JSON with the figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from offline_env import run_offline

run_offline()

import httpx  # noqa: E402
from bench_data import HOTPOT  # noqa: E402
from bench_filter_anywhere import free_port, start_server, wait_ready  # noqa: E402
from bench_server_abuse import stop_server  # noqa: E402

from sieverag.inference.core.types import Conversation  # noqa: E402
from sieverag.inference.data import load_examples  # noqa: E402
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME  # noqa: E402
from sieverag.inference.filters.filter_format import chunk_prompt  # noqa: E402
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL  # noqa: E402
from sieverag.inference.llm.openai_backend import (  # noqa: E402
    OpenAIBackend,
    OpenAIBackendConfig,
)

ROOT = Path(__file__).resolve().parents[2]
OLD_COMMIT = "2794b9dad31b3559a51c05dcc30a2e4de8592bda"
LABELS = ["Yes", "No"]

# A server that answers every POST at once with the same chat completion (top-20 log-probs).
CANNED_SERVER = """
import json, sys, uvicorn
top = [{"token": t, "logprob": -0.1 * i, "bytes": None} for i, t in
       enumerate(["Yes", "No"] + [f"w{i}" for i in range(18)])]
body = json.dumps({"id": "chatcmpl-canned", "object": "chat.completion", "created": 0,
                   "model": "canned", "choices": [{"index": 0, "finish_reason": "length",
                   "message": {"role": "assistant", "content": "Yes"},
                   "logprobs": {"content": [{**top[0], "top_logprobs": top}]}}],
                   "usage": {"prompt_tokens": 120, "completion_tokens": 1,
                             "total_tokens": 121}}).encode()
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def old_backend_module() -> ModuleType:
    """`inference/llm/openai_backend.py` as of OLD_COMMIT, imported as `old_openai_backend`."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:inference/llm/openai_backend.py"],
        capture_output=True, text=True)
    if source.returncode != 0:
        sys.exit(f"cannot read the old client from git ({source.stderr.strip()}): this "
                 "benchmark needs the repository's history")
    path = Path(tempfile.mkdtemp(prefix="sieverag-old-client-")) / "old_openai_backend.py"
    path.write_text(source.stdout)
    spec = importlib.util.spec_from_file_location("old_openai_backend", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_openai_backend"] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def make_clients(old: ModuleType, base_url: str, model: str, concurrency: int
                 ) -> dict[str, Any]:
    settings = {"base_url": base_url, "model": model, "max_concurrency": concurrency,
                "timeout_s": 600.0, "missing_label_logprob": "topk_min"}
    return {"old": old.OpenAIBackend(old.OpenAIBackendConfig(**settings)),
            "sdk": OpenAIBackend(OpenAIBackendConfig(**settings))}


@dataclass
class Spent:
    """What one client spent on its share of a measurement: wall and CPU seconds."""

    seconds: float = 0.0
    cpu_seconds: float = 0.0
    scores: list[dict[str, float]] = field(default_factory=list)


def side_by_side(clients: dict[str, Any], batches: Sequence[list[Conversation]]
                 ) -> dict[str, Spent]:
    """What each client spent on all `batches` (alternating which goes first), and the scores
    each returned."""
    spent = {name: Spent() for name in clients}
    for number, batch in enumerate(batches):
        order = list(clients) if number % 2 == 0 else list(reversed(clients))
        for name in order:
            started, cpu = time.perf_counter(), time.process_time()
            spent[name].scores += clients[name].label_logprobs(batch, LABELS, agent="filter")
            spent[name].seconds += time.perf_counter() - started
            spent[name].cpu_seconds += time.process_time() - cpu
    return spent


def start_canned(port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", CANNED_SERVER, str(port)])
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={}, timeout=2)
            return process
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                sys.exit("the canned server did not start")
            time.sleep(0.2)


def filter_prompts(questions: int) -> list[Conversation]:
    if not HOTPOT.is_file():
        sys.exit(f"{HOTPOT} is absent: set SIEVERAG_DATA_DIR to the shared data folder")
    return [chunk_prompt(example.question, document.text, document.title)
            for example in load_examples(HOTPOT, "hotpotqa", limit=questions)
            for document in example.documents]


def measure(label: str, unit: str, clients_by_count: dict[int, dict[str, Any]],
            batches: Callable[[int], list[list[Conversation]]], rows: list[str],
            figures: dict[str, Any], prefix: str,
            log: Callable[[str], None]) -> dict[str, list[dict[str, float]]]:
    """Rate (and client CPU per request) of both clients at each count in flight; the
    scores of the last count."""
    spent: dict[str, Spent] = {}
    for count, clients in clients_by_count.items():
        work = batches(count)
        requests = sum(map(len, work))
        log(f"{label}: {requests} requests per client, {count} in flight")
        spent = side_by_side(clients, work)
        rates = {name: requests / spent[name].seconds for name in clients}
        cpu_ms = {name: 1000 * spent[name].cpu_seconds / requests for name in clients}
        ratio = rates["sdk"] / rates["old"]
        rows.append(f"{label:<8} {count:>9} {rates['old']:>12.1f} {rates['sdk']:>12.1f} "
                    f"{ratio:>7.3f}  {unit:<12} {cpu_ms['old']:>7.2f} {cpu_ms['sdk']:>7.2f}")
        figures.update({f"{prefix}_{unit}_old_c{count}": round(rates["old"], 2),
                        f"{prefix}_{unit}_sdk_c{count}": round(rates["sdk"], 2),
                        f"{prefix}_ratio_c{count}": round(ratio, 3),
                        f"{prefix}_client_cpu_ms_old_c{count}": round(cpu_ms["old"], 3),
                        f"{prefix}_client_cpu_ms_sdk_c{count}": round(cpu_ms["sdk"], 3)})
    return {name: s.scores for name, s in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests: about a minute")
    parser.add_argument("--questions", type=int, default=None,
                        help="HotpotQA questions whose passages the filter scores (default 6; "
                             "--quick: 2)")
    args = parser.parse_args()
    rounds, per_round = (2, 128) if args.quick else (8, 256)
    questions = args.questions or (2 if args.quick else 6)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    old = old_backend_module()
    rows: list[str] = []
    figures: dict[str, Any] = {"old_commit": OLD_COMMIT[:12]}

    port = free_port()
    canned = start_canned(port)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        clients = {count: make_clients(old, url, "canned", count) for count in (1, 16)}
        prompt = [{"role": "user", "content": "Is this passage relevant? " * 20}]

        def canned_batches(count: int) -> list[list[Conversation]]:
            size = per_round // 8 if count == 1 else per_round
            return [[prompt] * size for _ in range(rounds)]

        side_by_side(clients[1], [[prompt] * 4])  # warm-up: connections, imports
        measure("canned", "req_per_s", clients, canned_batches, rows, figures, "canned", log)
        for pair in clients.values():
            for client in pair.values():
                client.close()
    finally:
        canned.terminate()
        canned.wait(30)

    prompts = filter_prompts(questions)
    server = start_server(0, "--model", DEFAULT_MODEL, "--adapters",
                          f"filter={DEFAULT_FILTER_NAME}")
    try:
        wait_ready(server)
        clients = {count: make_clients(old, server.base_url, "filter", count)
                   for count in (1, 8)}
        side_by_side(clients[1], [prompts[:2]])  # warm-up

        def filter_batches(count: int) -> list[list[Conversation]]:
            step = max(count, len(prompts) // 4)
            return [prompts[i:i + step] for i in range(0, len(prompts), step)]

        scores = measure("filter", "docs_per_s", clients, filter_batches, rows, figures,
                         "filter", log)
        for pair in clients.values():
            for client in pair.values():
                client.close()
    finally:
        stop_server(server)
    worst = max(abs(a[label] - b[label]) for a, b in zip(scores["old"], scores["sdk"],
                                                         strict=True) for label in LABELS)
    figures["filter_max_logprob_difference"] = worst

    print(f"openai backend: old httpx client ({OLD_COMMIT[:12]}) against the openai SDK "
          f"{__import__('openai').__version__}, {os.cpu_count()} CPU(s)")
    print(f"{'server':<8} {'in flight':>9} {'old client':>12} {'openai SDK':>12} {'ratio':>7}  "
          f"{'unit':<12} {'client CPU ms/request (old, SDK)'}")
    print("\n".join(rows))
    print(f"filter scores, old against SDK: largest log-prob difference {worst:.2e}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
