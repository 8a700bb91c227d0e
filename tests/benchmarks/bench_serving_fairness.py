"""Serving under heavy requests: long documents by their best window, and no client waiting
behind another's work (issue 54).

Starts the embedded server with the shipped filter (`--adapters filter=smollm2-filter`,
default settings: windows of the card's 256 tokens, at most 4 read per document, 512 prompt
tokens a step on CPU) in this process on a free port, and measures over HTTP:

(a) TEI `{"texts": ["word " * 20000], "truncate": true}`: seconds (goal <= 5; the issue
    measured 60 s when truncate cut to the 8,192-token context).
(b) A 20,000-word document of sentences (one of them the answer) without truncate, read
    window by window: seconds (goal <= 10).
(c) The same document's score against its best read window sent alone (the window MCF
    judged it by, found by running MCF on the server's engine): |difference| (goal <= 1e-4).
(d) A one-document /v1/rerank alone, then sent one after another while a request of 100
    documents x 2,000 tokens (10 with --quick) has its windows on the engine, then alone
    again: median latency during / median alone (goal <= 2; the issue measured 53 s of wait
    behind a 60 s request). The large request's client then goes away: the windows it
    still had are dropped (counted).

    python tests/benchmarks/bench_serving_fairness.py [--quick]

Prints a table, then one line of JSON with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from typing import Any

from offline_env import run_offline

run_offline()

import httpx  # noqa: E402

from sieverag.inference.core.types import Document  # noqa: E402
from sieverag.inference.filters.card.combination import card_combination  # noqa: E402
from sieverag.inference.filters.mcf import MultiGranularFilter  # noqa: E402
from sieverag.serving.config import LocalServerConfig  # noqa: E402
from sieverag.serving.engine.engine_backend import EngineBackend  # noqa: E402
from sieverag.serving.local_server import LocalServer  # noqa: E402

QUERY = "Where was the cartographer Liora Tamsin born?"
ANSWER = "The cartographer Liora Tamsin was born in Quorrin, a small port on the north coast."
SMALL = ("Quorrin is a port town on the north coast. The cartographer Liora Tamsin was born "
         "there in 1848 and later mapped its harbour.")
TOPICS = ["the water cycle", "photosynthesis", "the printing press", "volcanoes", "honey bees",
          "ocean tides", "the silk road", "glaciers", "coral reefs", "electric motors"]
SENTENCES = ["Scholars have studied {t} for a long time in many places around the world.",
             "A clear account of {t} helps students understand several related ideas.",
             "Recent work on {t} relied on new measurements and careful comparisons.",
             "Several details about {t} are still debated at conferences every year.",
             "Museums often present {t} with models, maps and short films for visitors."]


def prose(words: int, seed: int, answer: str | None = None) -> str:
    """About `words` words of sentences on varied topics; `answer` in the middle."""
    sentences: list[str] = []
    count, i = 0, seed
    while count < words:
        sentence = SENTENCES[i % len(SENTENCES)].format(t=TOPICS[(i // 3) % len(TOPICS)])
        sentences.append(sentence)
        count += len(sentence.split())
        i += 1
    if answer is not None:
        sentences.insert(len(sentences) // 2, answer)
    return " ".join(sentences)


def timed_post(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    reply = client.post(path, json=body)
    seconds = time.perf_counter() - started
    if reply.status_code != 200:
        raise SystemExit(f"{path} answered {reply.status_code}: {reply.text[:500]}")
    return seconds, reply.json()


def small_rerank(client: httpx.Client) -> float:
    seconds, _ = timed_post(client, "/v1/rerank", {"model": "filter", "query": QUERY,
                                                   "documents": [SMALL]})
    return seconds


def send_and_keep_open(server: LocalServer, body: dict[str, Any]) -> socket.socket:
    """The request sent on a connection left open: closing it is the client going away."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=600)
    sock.sendall(b"POST /v1/rerank HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                 b"application/json\r\nContent-Length: " + str(len(data)).encode()
                 + b"\r\n\r\n" + data)
    return sock


def wait_for(condition: Any, what: str, timeout_s: float = 900) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise SystemExit(f"still waiting for {what} after {timeout_s:.0f} s")
        time.sleep(0.01)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 10-document large request "
                        "and 3 small ones each way: under a minute")
    args = parser.parse_args()
    big_documents, repeats = (10, 3) if args.quick else (100, 8)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    config = LocalServerConfig(adapters=("filter=smollm2-filter",), port=0, access_log=False,
                               log_level="warning")
    with LocalServer(config) as server, httpx.Client(
            base_url=server.base_url.removesuffix("/v1"), timeout=900) as client:
        tokenizer = server.engine.served.tokenizer
        engine = server.engine
        small_rerank(client)  # warm-up: the embedding model loads
        log("(a) TEI truncate, 20,000 words ...")
        truncate_s, _ = timed_post(client, "/rerank", {"query": QUERY, "truncate": True,
                                                       "texts": ["word " * 20000]})
        log("(b) 20,000 words read window by window ...")
        long_text = prose(20000, 0, ANSWER)
        windows_s, answer = timed_post(client, "/v1/rerank", {
            "model": "filter", "query": QUERY, "documents": [long_text]})
        long_score = answer["results"][0]["relevance_score"]
        log("(c) its best read window alone ...")
        mcf = MultiGranularFilter(EngineBackend(engine, "filter"), server.config.rerank,
                                  card_combination(server.cards.get("filter")))
        judged = mcf.select(QUERY, [Document(id="0", text=long_text)]).scored[0]
        start, end = judged.details["window"]
        _, alone = timed_post(client, "/v1/rerank", {"model": "filter", "query": QUERY,
                                                     "documents": [long_text[start:end]]})
        window_difference = abs(long_score - alone["results"][0]["relevance_score"])

        log(f"(d) a small rerank alone, during a {big_documents}-document x 2,000-token "
            "request, alone again ...")
        alone_s = [small_rerank(client) for _ in range(repeats)]
        documents = []
        for seed in range(big_documents):
            text = prose(1700, seed + 1)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            documents.append(tokenizer.decode(ids[:2000]))
        cancelled = engine.stats.cancelled
        big_started = time.perf_counter()
        sock = send_and_keep_open(server, {"model": "filter", "query": QUERY,
                                           "documents": documents})
        # Its windows are on the engine once its BM25 + dense choice of windows is done.
        wait_for(lambda: engine.in_flight > repeats, "the large request's windows")
        big_windows = engine.in_flight
        log(f"    the large request has {big_windows} windows on the engine after "
            f"{time.perf_counter() - big_started:.1f} s")
        during_s = [small_rerank(client) for _ in range(repeats)]
        still = engine.in_flight
        sock.close()  # the large request's client goes away
        dropped_after_s = wait_for(lambda: engine.in_flight == 0, "its windows to leave")
        dropped = engine.stats.cancelled - cancelled
        alone_s += [small_rerank(client) for _ in range(repeats)]
        big_alive_s = time.perf_counter() - big_started

    alone_median, during_median = statistics.median(alone_s), statistics.median(during_s)
    figures = {
        "tei_truncate_20k_words_s": round(truncate_s, 2),
        "windows_20k_words_s": round(windows_s, 2),
        "best_window_score_difference": float(f"{window_difference:.2e}"),
        "small_alone_s": round(alone_median, 3),
        "small_during_s": round(during_median, 3),
        "fairness_ratio": round(during_median / alone_median, 2),
        "big_documents": big_documents, "big_windows": big_windows,
        "big_windows_left_at_disconnect": still, "big_windows_dropped": dropped,
        "dropped_within_s": round(dropped_after_s, 2), "big_request_ran_s": round(big_alive_s, 1),
    }
    print(f"embedded server, shipped filter, {os.cpu_count()} CPU(s); window "
          f"{mcf.windows.window_tokens} tokens, {mcf.windows.max_windows} read a document, "
          f"{engine.max_batch_tokens} prompt tokens a step")
    rows = [
        ("TEI truncate, 20,000 words", f"{truncate_s:.2f} s", "<= 5 s (was 60 s)"),
        ("20,000 words, read by windows", f"{windows_s:.2f} s", "<= 10 s"),
        ("its score - best window's alone", f"{window_difference:.1e}", "<= 1e-4"),
        ("1-doc rerank alone (median)", f"{alone_median:.3f} s", ""),
        (f"1-doc rerank during {big_documents} x 2,000 tok", f"{during_median:.3f} s",
         "(was 53 s of wait)"),
        ("  during / alone", f"{during_median / alone_median:.2f}x", "<= 2x"),
        ("large request's windows dropped", f"{dropped} of {still} left",
         f"within {dropped_after_s:.2f} s of its client leaving"),
    ]
    print(f"{'measure':<36} {'figure':>16}  goal")
    for name, figure, goal in rows:
        print(f"{name:<36} {figure:>16}  {goal}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
