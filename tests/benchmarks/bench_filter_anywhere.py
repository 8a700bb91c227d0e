"""The filter anywhere: the rerank endpoint's throughput, and the filtering proxy in front of a
generator, both on the shipped filter over the embedded model.

Two servers, each `sieverag serve --engine local` on a free port in a process of its own,
started side by side:
the upstream generator (the embedded SmolLM2-135M-Instruct, no adapter) and, in front of it,
the filter server (the same base model with the shipped filter, served as smollm2-filter,
`--proxy-to` the upstream). Questions are HotpotQA distractor validation questions, each with
its 10 passages.

  rerank   /v1/rerank requests of one question's 10 passages on the filter server: documents/s
           with 1 client, then with 8 concurrent clients (the ratio: what batching gains; the
           requests repeated up to a multiple of 8, so every client is busy to the end), and
           the same requests scored in this process by the same code (`rank_by_filter`, MCF)
           on the same engine the server runs (built as `sieverag serve` builds it, run here
           without HTTP): the endpoint's overhead = in-process documents/s ÷ endpoint's
           (1 client), HTTP and the server's checks. For reference, the framework adapters'
           in-process mode (`InProcessFilter`: MCF on the `hf` backend, plain transformers
           forward passes). The three are alternated request by request, so a busier moment
           hits them alike.
  proxy    each question asked twice, alternately, greedy: straight to the upstream with all 10
           passages in a <documents> block, and through the proxy with the passages as a
           `documents` field (the proxy keeps MCF's default, 2 of 10): the generator's mean
           prompt tokens (its `usage`), accuracy (`answer_accuracy`: a gold alias in the
           answer), seconds per question, the share of gold passages the proxy kept, and its
           own estimate of the tokens saved (`prompt_tokens_saved`, filter tokenizer) beside
           the saving the upstream counted.

    python tests/benchmarks/bench_filter_anywhere.py [--quick] [--data FILE]
        [--question-ids FILE] [--limit 50] [--rerank-requests 20]

`--quick` (a smoke run, about a minute): every question cut to its first 3 passages, each cut
to its title and first sentence; 1 rerank request (8 for the 8 clients), 1 question through the
proxy.

Prints a table, then one line of JSON with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from offline_env import run_offline

run_offline()

import httpx  # noqa: E402
from bench_data import HOTPOT  # noqa: E402

from sieverag.inference.core.prompt_templates import load_template  # noqa: E402
from sieverag.inference.core.types import Example  # noqa: E402
from sieverag.inference.data import load_examples  # noqa: E402
from sieverag.inference.eval.runner import read_question_ids  # noqa: E402
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME  # noqa: E402
from sieverag.inference.filters.mcf import MCFConfig  # noqa: E402
from sieverag.inference.filters.ranking import as_documents, rank_by_filter  # noqa: E402
from sieverag.inference.integrations.in_process import InProcessFilter  # noqa: E402
from sieverag.inference.llm.model_resolution import DEFAULT_MODEL  # noqa: E402
from sieverag.inference.metrics.answer_scores import answer_accuracy  # noqa: E402
from sieverag.serving.config import LocalServerConfig  # noqa: E402
from sieverag.serving.engine.engine_backend import EngineBackend  # noqa: E402
from sieverag.serving.local_server import LocalServer  # noqa: E402
from sieverag.serving.proxy.marked_documents import Passage, documents_block  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
QUESTION_IDS = ROOT / "runs" / "dataset-hotpot" / "validation_ids.txt"
ANNOUNCED = re.compile(r"serving .+ at (?P<url>http://127\.0\.0\.1:(?P<port>\d+)/v1)")
CONCURRENT_CLIENTS = 8
MAX_ANSWER_TOKENS = 32
# The question's instruction: the project's answer prompt (documents come as a block).
INSTRUCTION = load_template("answer_with_documents").system
ASK = load_template("answer_direct")


@dataclass
class Server:
    command: list[str]
    process: subprocess.Popen[str]
    lines: queue.SimpleQueue[str]
    output: deque[str]
    base_url: str = ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int, *flags: str) -> Server:
    """`sieverag serve --engine local --port PORT FLAGS` starting (0: a free port)."""
    command = [sys.executable, "-m", "sieverag", "serve", "--engine", "local", "--port",
               str(port), "--no-local.access-log", *flags]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    server = Server(command, process, queue.SimpleQueue(), deque(maxlen=200))

    def read() -> None:
        for line in process.stdout:
            server.output.append(line)
            server.lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return server


def wait_ready(server: Server, timeout_s: float = 300) -> None:
    """Until the server announces its URL; exits with its output if it never does."""
    deadline = time.monotonic() + timeout_s
    while not server.base_url:
        if server.process.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"`{' '.join(server.command)}` did not start:\n" + "".join(server.output))
        try:
            found = ANNOUNCED.search(server.lines.get(timeout=0.5))
        except queue.Empty:
            continue
        if found:
            server.base_url = found["url"]


@contextmanager
def serving_pair() -> Iterator[tuple[Server, Server]]:
    """The upstream generator and the filter server proxying to it, started side by side
    (the upstream on a port picked beforehand), stopped (SIGINT) at the end."""
    port = free_port()
    upstream_url = f"http://127.0.0.1:{port}/v1"
    servers = [start_server(port, "--model", DEFAULT_MODEL),
               start_server(0, "--model", DEFAULT_MODEL, "--proxy-to", upstream_url,
                            "--proxy-model", DEFAULT_MODEL)]
    try:
        for server in servers:
            wait_ready(server)
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.process.send_signal(signal.SIGINT)
        for server in servers:
            try:
                server.process.wait(30)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait(30)


def pick_questions(data: Path, ids_file: Path, limit: int) -> list[Example]:
    """The listed questions (in the dataset's order) that have 10 passages, the first `limit`."""
    if not ids_file.is_file():
        sys.exit(f"question ids file {ids_file} not found: pass --question-ids (the validation "
                 "split `sieverag build-dataset` writes as runs/dataset-hotpot/validation_ids.txt)")
    wanted = set(read_question_ids(ids_file))
    examples = [e for e in load_examples(data, "hotpotqa")
                if e.id in wanted and len(e.documents) == 10]
    if not examples:
        sys.exit(f"no question of {ids_file} in {data} has 10 passages")
    return examples[:limit]


# ----- rerank -----

def smoke_sized(example: Example) -> Example:
    """`example` with its first 3 passages, each cut to its first sentence (--quick)."""
    documents = tuple(replace(d, text=(d.sentences or (d.text,))[0].strip(),
                              sentences=(d.sentences or (d.text,))[:1],
                              supporting_sentences=None)
                      for d in example.documents[:3])
    return replace(example, documents=documents)


def rerank_body(example: Example) -> dict:
    """A rerank request of the question's passages, each as the filter reads one."""
    documents = [d.as_context() for d in example.documents]
    return {"model": DEFAULT_FILTER_NAME, "query": example.question, "return_documents": False,
            "documents": documents}


def post_ok(client: httpx.Client, url: str, body: dict) -> dict:
    reply = client.post(url, json=body)
    if reply.status_code != 200:
        sys.exit(f"POST {url} answered {reply.status_code}: {reply.text[:500]}")
    return reply.json()


async def concurrent_rerank(url: str, bodies: Sequence[dict], clients: int) -> float:
    """Seconds for `clients` concurrent clients to send every body once, between them."""
    pending: asyncio.Queue[dict] = asyncio.Queue()
    for body in bodies:
        pending.put_nowait(body)

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not pending.empty():
            reply = await client.post(url, json=pending.get_nowait())
            if reply.status_code != 200:
                raise SystemExit(f"POST {url} answered {reply.status_code}: {reply.text[:500]}")

    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
        return time.perf_counter() - start


@contextmanager
def in_process_engine() -> Iterator[EngineBackend]:
    """The filter server's engine, built as `sieverag serve` builds it (the shipped filter
    served as DEFAULT_FILTER_NAME, the default batching), run in this process without HTTP."""
    server = LocalServer(LocalServerConfig(
        model=DEFAULT_MODEL, adapters=(f"{DEFAULT_FILTER_NAME}={DEFAULT_FILTER_NAME}",)))
    server.engine.start()
    try:
        yield EngineBackend(server.engine, DEFAULT_FILTER_NAME)
    finally:
        server.engine.close()


def measure_rerank(server: Server, examples: Sequence[Example]) -> dict[str, float]:
    url = f"{server.base_url}/rerank"
    bodies = [rerank_body(e) for e in examples]
    documents = sum(len(b["documents"]) for b in bodies)
    hf = InProcessFilter(DEFAULT_FILTER_NAME, keep="top_n")  # the adapters' in-process mode
    config = MCFConfig()  # the server's default rules (--local.rerank.*)
    seconds = {"endpoint": 0.0, "engine": 0.0, "hf": 0.0}
    with httpx.Client(timeout=600) as client, in_process_engine() as engine:
        ways = {"endpoint": lambda body: post_ok(client, url, body),
                "engine": lambda body: rank_by_filter(engine, config, body["query"],
                                                      as_documents(body["documents"])),
                "hf": lambda body: hf.select(body["query"], body["documents"])}
        for way in ways.values():  # warm every way up
            way(bodies[0])
        for body in bodies:  # alternated: a busier moment hits every way alike
            for name, way in ways.items():
                start = time.perf_counter()
                way(body)
                seconds[name] += time.perf_counter() - start
    # Every client busy to the end: the requests repeated up to a multiple of the clients.
    rounds = -(-len(bodies) // CONCURRENT_CLIENTS)
    concurrent = [bodies[i % len(bodies)] for i in range(rounds * CONCURRENT_CLIENTS)]
    concurrent_s = asyncio.run(concurrent_rerank(url, concurrent, CONCURRENT_CLIENTS))
    one = documents / seconds["endpoint"]
    many = sum(len(b["documents"]) for b in concurrent) / concurrent_s
    in_process = documents / seconds["engine"]
    return {"rerank_requests": len(bodies), "rerank_docs_per_s_1": one,
            "rerank_docs_per_s_8": many, "concurrency_ratio": many / one,
            "in_process_docs_per_s": in_process, "endpoint_overhead": in_process / one,
            "endpoint_overhead_ms_per_request":
                1000 * (seconds["endpoint"] - seconds["engine"]) / len(bodies),
            "hf_in_process_docs_per_s": documents / seconds["hf"]}


# ----- proxy -----

def question_messages(example: Example, with_block: bool) -> list[dict]:
    """The instruction and the question; `with_block`: all passages before it, as the proxy
    would forward them had it kept every one."""
    question = str(ASK.messages(question=example.question)[-1]["content"])
    if with_block:
        passages = [Passage(str(i + 1), d) for i, d in enumerate(example.documents)]
        question = f"{documents_block(passages)}\n\n{question}"
    return [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": question}]


def ask(client: httpx.Client, url: str, body: dict) -> tuple[dict, float]:
    start = time.perf_counter()
    reply = post_ok(client, url, {"model": DEFAULT_MODEL, "temperature": 0,
                                  "max_tokens": MAX_ANSWER_TOKENS, **body})
    return reply, time.perf_counter() - start


def measure_proxy(upstream: Server, proxy: Server, examples: Sequence[Example]
                  ) -> dict[str, float]:
    direct_url = f"{upstream.base_url}/chat/completions"
    proxy_url = f"{proxy.base_url}/chat/completions"
    rows = []
    with httpx.Client(timeout=600) as client:
        for index, example in enumerate(examples, 1):
            documents = [{"text": d.text, "title": d.title} for d in example.documents]
            direct, direct_s = ask(client, direct_url,
                                   {"messages": question_messages(example, with_block=True)})
            filtered, proxy_s = ask(client, proxy_url, {
                "messages": question_messages(example, with_block=False),
                "documents": documents})
            info = filtered["sieverag"]
            gold = [i for i, d in enumerate(example.documents) if d.is_gold]
            rows.append({
                "direct_tokens": direct["usage"]["prompt_tokens"],
                "proxy_tokens": filtered["usage"]["prompt_tokens"],
                "direct_accuracy": answer_accuracy(_answer(direct), example.answers),
                "proxy_accuracy": answer_accuracy(_answer(filtered), example.answers),
                "direct_s": direct_s, "proxy_s": proxy_s,
                "estimated_saved": info["prompt_tokens_saved"],
                "gold_kept": (len(set(gold) & set(info["kept"])) / len(gold)) if gold else None,
                "kept": info["documents_kept"]})
            print(f"  {index}/{len(examples)}  tokens {rows[-1]['direct_tokens']} -> "
                  f"{rows[-1]['proxy_tokens']}", file=sys.stderr, flush=True)

    def mean(key: str) -> float:
        values = [row[key] for row in rows if row[key] is not None]
        return statistics.fmean(values) if values else float("nan")

    return {"questions": len(rows),
            "direct_prompt_tokens": mean("direct_tokens"),
            "proxy_prompt_tokens": mean("proxy_tokens"),
            "token_ratio": mean("proxy_tokens") / mean("direct_tokens"),
            "upstream_tokens_saved": mean("direct_tokens") - mean("proxy_tokens"),
            "estimated_tokens_saved": mean("estimated_saved"),
            "direct_accuracy": mean("direct_accuracy"), "proxy_accuracy": mean("proxy_accuracy"),
            "direct_s_per_question": mean("direct_s"), "proxy_s_per_question": mean("proxy_s"),
            "passages_kept": mean("kept"), "gold_passages_kept": mean("gold_kept")}


def _answer(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"] or ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="3 one-sentence passages a question, 1 rerank request (8 for the "
                             "8 clients) and 1 question: about a minute")
    parser.add_argument("--data", type=Path, default=HOTPOT,
                        help="HotpotQA distractor jsonl (default: the shared data folder's)")
    parser.add_argument("--question-ids", type=Path, default=QUESTION_IDS,
                        help="the validation questions' ids, one a line")
    parser.add_argument("--limit", type=int, default=50, help="questions asked via the proxy")
    parser.add_argument("--rerank-requests", type=int, default=20,
                        help="10-passage rerank requests (one per question)")
    args = parser.parse_args()
    questions, rerank_requests = (1, 1) if args.quick else (args.limit, args.rerank_requests)
    examples = pick_questions(args.data, args.question_ids, max(questions, rerank_requests))
    if args.quick:
        examples = [smoke_sized(e) for e in examples]
    passages = len(examples[0].documents)

    with serving_pair() as (upstream, proxy):
        print(f"rerank: {rerank_requests} requests of {passages} passages ...", file=sys.stderr)
        rerank = measure_rerank(proxy, examples[:rerank_requests])
        print(f"proxy: {questions} questions ...", file=sys.stderr)
        proxied = measure_proxy(upstream, proxy, examples[:questions])

    shape = f"{passages} one-sentence passages" if args.quick else f"{passages} passages"
    print(f"\nrerank endpoint, shipped filter on {DEFAULT_MODEL}, "
          f"{rerank['rerank_requests']} requests of {shape}")
    print(f"{'':28}{'documents/s':>12}")
    print(f"{'endpoint, 1 client':28}{rerank['rerank_docs_per_s_1']:>12.1f}")
    print(f"{'endpoint, 8 clients':28}{rerank['rerank_docs_per_s_8']:>12.1f}"
          f"   x{rerank['concurrency_ratio']:.2f}")
    print(f"{'in process, same engine':28}{rerank['in_process_docs_per_s']:>12.1f}"
          f"   endpoint overhead x{rerank['endpoint_overhead']:.2f} "
          f"({rerank['endpoint_overhead_ms_per_request']:+.0f} ms/request)")
    print(f"{'in process, InProcessFilter':28}{rerank['hf_in_process_docs_per_s']:>12.1f}")
    print(f"\nproxy on HotpotQA validation, {proxied['questions']} questions, generator "
          f"{DEFAULT_MODEL} (greedy, {MAX_ANSWER_TOKENS} tokens)")
    print(f"{'':28}{'prompt tokens':>14}{'accuracy':>10}{'s/question':>12}")
    print(f"{f'straight, {passages} passages':28}{proxied['direct_prompt_tokens']:>14.1f}"
          f"{proxied['direct_accuracy']:>10.3f}{proxied['direct_s_per_question']:>12.2f}")
    print(f"{'through the proxy':28}{proxied['proxy_prompt_tokens']:>14.1f}"
          f"{proxied['proxy_accuracy']:>10.3f}{proxied['proxy_s_per_question']:>12.2f}")
    print(f"tokens ratio {proxied['token_ratio']:.3f}; saved {proxied['upstream_tokens_saved']:.1f}"
          f" (upstream) vs {proxied['estimated_tokens_saved']:.1f} (proxy's estimate); passages "
          f"kept {proxied['passages_kept']:.1f} of {passages}, gold kept "
          f"{proxied['gold_passages_kept']:.2f}")
    print(json.dumps({key: round(value, 4) if isinstance(value, float) else value
                      for key, value in {**rerank, **proxied}.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
