"""Serving under heavy requests, on the tiny model with a random filter adapter whose card
reads 24-token windows: a long document is read window by window and scores as its best
window sent alone, in every dialect and /v1/score; truncation cuts to one window; a request
over the filter-token budget is refused before any work; the engine takes sequences in turn
from each request; a client that goes away has its remaining windows dropped; an empty query
is refused and a blank document scores 0."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from rerank_server import http_at_root, post  # noqa: F401 (http_at_root: the http fixture)
from tiny_adapter import make_lora_adapter, one_torch_thread  # noqa: F401 (autouse)

from sieverag.inference.core.types import Document
from sieverag.inference.filters.card.card_file import CARD_FILE
from sieverag.inference.filters.card.combination import card_combination
from sieverag.inference.filters.mcf import MultiGranularFilter, window_rule
from sieverag.inference.filters.round_plan import plan_round
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.engine import scheduling
from sieverag.serving.engine.continuous_batching import BatchingEngine
from sieverag.serving.engine.engine_backend import EngineBackend
from sieverag.serving.engine.sequence_types import SequenceRequest
from sieverag.serving.engine.served_model import load_served_model
from sieverag.serving.local_server import LocalServer

QUERY = "Where was Liora Tamsin born?"
FILLER = [f"Filler sentence number {i} says very little of use." for i in range(12)]
ANSWER = "Liora Tamsin was born in Quorrin, a port town."
LONG = " ".join(FILLER[:7] + [ANSWER] + FILLER[7:])
OTHER = "Penguins huddle together in winter."
WINDOW_TOKENS = 24
BUDGET = 3000
CARD = {"recipe": {"training": {"max_length": WINDOW_TOKENS}},
        "combination": {"weights": {"filter_log_odds": 0.8, "filter_z": 0.3, "bm25_z": 0.4,
                                    "dense": 1.2, "dense_z": 0.2},
                        "bias": -0.3, "bar": 0.5}}
DISCONNECT_LOGGER = "sieverag.serving.api.middleware.disconnect"


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[LocalServer]:
    adapter = make_lora_adapter(tiny_model_dir, tmp_path_factory.mktemp("windowed-filter"))
    (adapter / CARD_FILE).write_text(json.dumps(CARD), encoding="utf-8")
    config = LocalServerConfig(model=str(tiny_model_dir), adapters=(f"filter={adapter}",),
                               port=0, access_log=False, max_request_tokens=BUDGET)
    with LocalServer(config) as running:
        yield running


def scores(http: httpx.Client, texts: list[str], **fields: Any) -> dict[int, float]:
    answer = post(http, "/v1/rerank", {"model": "filter", "query": QUERY, "documents": texts,
                                       **fields})
    return {r["index"]: r["relevance_score"] for r in answer["results"]}


def best_window(server: LocalServer, text: str, others: list[str]) -> str:
    """The window MCF judges `text` by, in a round with `others`, on the server's engine."""
    mcf = MultiGranularFilter(EngineBackend(server.engine, "filter"), server.config.rerank,
                              card_combination(CARD))
    judged = mcf.select(QUERY, [Document(id="0", text=text),
                                *(Document(id=str(i + 1), text=t) for i, t in
                                  enumerate(others))]).scored[0]
    start, end = judged.details["window"]
    return text[start:end]


def prefilled(engine: BatchingEngine) -> int:
    return sum(size * count for size, count in engine.stats.prefill_batch_sizes.items())


# ----- long documents by their best window -----

def test_a_long_document_scores_as_its_best_read_window_sent_alone(
        server: LocalServer, http: httpx.Client) -> None:
    long = scores(http, [LONG, OTHER])
    window = best_window(server, LONG, [OTHER])
    assert window in LONG and len(window) < len(LONG)
    alone = scores(http, [window, OTHER])
    assert long == pytest.approx(alone, abs=1e-4)
    # The same through every dialect and /v1/score.
    tei = post(http, "/rerank", {"query": QUERY, "texts": [LONG, OTHER]})
    assert {r["index"]: r["score"] for r in tei} == pytest.approx(long, abs=1e-6)
    v2 = post(http, "/v2/rerank", {"model": "filter", "query": QUERY,
                                   "documents": [LONG, OTHER]})
    assert {r["index"]: r["relevance_score"] for r in v2["results"]} == pytest.approx(
        long, abs=1e-6)
    score = post(http, "/v1/score", {"model": "filter", "text_1": QUERY,
                                     "text_2": [LONG, OTHER]})
    assert [d["score"] for d in score["data"]] == pytest.approx([long[0], long[1]], abs=1e-6)


def test_spans_of_a_long_document_are_offsets_into_it(server: LocalServer,
                                                      http: httpx.Client) -> None:
    answer = post(http, "/v1/rerank", {"model": "filter", "query": QUERY, "top_n": 1,
                                       "documents": [LONG], "return_spans": True})
    (result,) = answer["results"]
    spans = result["spans"]
    assert spans[0]["start"] == 0 and spans[-1]["end"] == len(LONG)
    assert [LONG[s["start"]:s["end"]] for s in spans] == [*FILLER[:7], ANSWER, *FILLER[7:]]
    window = best_window(server, LONG, [])
    kept = [LONG[s["start"]:s["end"]] for s in spans if s["kept"]]
    assert kept and all(sentence in window for sentence in kept)
    assert result["pruned_text"] == " ".join(kept)


def test_truncation_cuts_to_the_filters_window(server: LocalServer, http: httpx.Client) -> None:
    rule = window_rule(EngineBackend(server.engine, "filter"), server.config.rerank,
                       card_combination(CARD))
    assert rule.window_tokens == WINDOW_TOKENS
    first, last = rule.cut(LONG), rule.cut(LONG, "end")
    assert LONG.startswith(first) and LONG.endswith(last) and len(first) < len(LONG)
    for body, kept in (({"truncate": True}, first),
                       ({"truncate": True, "truncation_direction": "Left"}, last)):
        cut = post(http, "/rerank", {"query": QUERY, "texts": [LONG, OTHER], **body})
        alone = post(http, "/rerank", {"query": QUERY, "texts": [kept, OTHER]})
        assert {r["index"]: r["score"] for r in cut} == pytest.approx(
            {r["index"]: r["score"] for r in alone}, abs=1e-4)
    voyage = post(http, "/v1/rerank", {"model": "filter", "query": QUERY, "top_k": 2,
                                       "documents": [LONG, OTHER]})  # Voyage cuts by default
    assert {d["index"]: d["relevance_score"] for d in voyage["data"]} == pytest.approx(
        scores(http, [first, OTHER]), abs=1e-4)


def test_max_chunks_per_doc_bounds_the_windows_read(http: httpx.Client) -> None:
    def tokens(windows: int) -> int:
        return post(http, "/v1/rerank", {"model": "filter", "query": QUERY, "documents": [LONG],
                                         "max_chunks_per_doc": windows})["usage"]["total_tokens"]

    one, three = tokens(1), tokens(3)
    assert 0 < one < three
    assert tokens(3) == three  # deterministic


# ----- the work budget -----

@pytest.mark.parametrize(("path", "body"), [
    ("/v1/rerank", {"model": "filter", "documents": [LONG] * 20}),
    ("/v2/rerank", {"model": "filter", "documents": [LONG] * 20}),
    ("/rerank", {"texts": [LONG] * 20}),
    ("/v1/rerank", {"model": "filter", "documents": [LONG] * 20, "top_k": 1,
                    "truncation": False}),
    ("/v1/rerank", {"model": "filter", "documents": [LONG] * 20, "raw_scores": True}),
    ("/v1/score", {"model": "filter", "text_2": [LONG] * 20}),
])
def test_a_request_over_the_token_budget_is_refused_before_any_work(
        server: LocalServer, http: httpx.Client, path: str, body: dict[str, Any]) -> None:
    before = prefilled(server.engine)
    query = {"text_1": QUERY} if path == "/v1/score" else {"query": QUERY}
    reply = http.post(path, json={**body, **query})
    assert reply.status_code == 413, reply.text
    error = reply.json()["error"]
    assert error["code"] == "request_too_large" and f"at most {BUDGET:,}" in error["message"]
    needed = int(error["message"].split("need up to ")[1].split(" ")[0].replace(",", ""))
    assert needed > BUDGET
    assert prefilled(server.engine) == before  # nothing ran
    # Within the budget, the same documents are read.
    assert post(http, "/v1/rerank", {"model": "filter", "query": QUERY,
                                     "documents": [LONG] * 2})


# ----- bad input -----

@pytest.mark.parametrize("query", ["", "   ", "\n\t "])
@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/rerank", {"model": "filter", "documents": [OTHER]}, "query"),
    ("/v2/rerank", {"model": "filter", "documents": [OTHER]}, "query"),
    ("/rerank", {"texts": [OTHER]}, "query"),
    ("/v1/rerank", {"model": "filter", "documents": [OTHER], "top_k": 1}, "query"),
    ("/v1/rerank", {"model": "filter", "documents": [OTHER], "raw_scores": True}, "query"),
    ("/v1/score", {"model": "filter", "text_2": [OTHER]}, "text_1"),
    ("/v1/score", {"model": "filter", "documents": [OTHER]}, "queries"),
])
def test_an_empty_query_is_refused_in_every_dialect(http: httpx.Client, query: str, path: str,
                                                    body: dict[str, Any], param: str) -> None:
    sent = {**body, param: query}
    reply = http.post(path, json=sent)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and "empty" in error["message"]


def test_a_blank_document_scores_zero_and_is_not_kept(http: httpx.Client) -> None:
    answer = post(http, "/v1/rerank", {"model": "filter", "query": QUERY, "return_spans": True,
                                       "documents": ["", OTHER, " \n\t", ANSWER]})
    by_index = {r["index"]: r for r in answer["results"]}
    for blank in (0, 2):
        assert by_index[blank]["relevance_score"] == 0.0 and not by_index[blank]["kept"]
        assert by_index[blank]["spans"] == [] and by_index[blank]["pruned_text"] == ""
    assert by_index[1]["kept"] or by_index[3]["kept"]  # at least the best of the others
    # The others rank as they do without the blanks.
    alone = scores(http, [OTHER, ANSWER])
    assert (by_index[1]["relevance_score"], by_index[3]["relevance_score"]) == pytest.approx(
        (alone[0], alone[1]), abs=1e-4)
    tei = post(http, "/rerank", {"query": QUERY, "texts": [" ", OTHER]})
    assert {r["index"]: r["score"] for r in tei}[0] == 0.0


# ----- fair turns -----

def test_the_engine_takes_sequences_in_turn_from_each_request(tiny_model_dir: Path) -> None:
    """Six sequences of one request wait; one of another arrives after them: it is taken in
    the next step, not after the six. Each step takes what fits `max_batch_tokens`."""
    served = load_served_model(str(tiny_model_dir), ())
    ids = tuple(served.tokenizer("a prompt of a few tokens")["input_ids"])
    engine = BatchingEngine(served, batch_window_s=0.0, max_batch_tokens=len(ids))
    try:  # never started: the test takes each step's sequences itself
        big = [engine.submit(SequenceRequest(served.name, ids, 1), owner="big")
               for _ in range(6)]
        small = engine.submit(SequenceRequest(served.name, ids, 1), owner="small")
        futures = {id(f): name for name, group in (("big", big), ("small", [small]))
                   for f in group}
        steps = [[futures[id(s.future)] for s in engine._take_new()] for _ in range(7)]
        assert steps == [["big"], ["small"], ["big"], ["big"], ["big"], ["big"], ["big"]]
        engine.max_batch_tokens = 3 * len(ids)  # three at a time: one of each, in turn
        again = [engine.submit(SequenceRequest(served.name, ids, 1), owner=o)
                 for o in ("a", "a", "a", "b", "c", "c")]
        names = {id(f): o for f, o in zip(again, "aaabcc", strict=True)}
        assert [[names[id(s.future)] for s in engine._take_new()] for _ in range(2)] == [
            ["a", "b", "c"], ["a", "c", "a"]]
    finally:
        engine.close()


def test_a_long_prefill_yields_to_other_requests_between_slices(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt of three slices runs; another request queues two short sequences during the
    first slice: one runs before the second slice (once per request a pass), the other after
    the long one."""
    monkeypatch.setattr(scheduling, "CPU_PROMPT_SLICE", 16)
    served = load_served_model(str(tiny_model_dir), ())
    tokenizer = served.tokenizer
    long_ids = tuple(tokenizer(" ".join(f"word{i}" for i in range(16)))["input_ids"])
    short_ids = tuple(tokenizer("A short one")["input_ids"])
    assert 32 < len(long_ids) <= 48
    engine = BatchingEngine(served, batch_window_s=0.0, max_batch_tokens=len(short_ids))
    widths: list[int] = []
    short: list[Any] = []

    def record(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        widths.append(kwargs["input_ids"].shape[1])
        if len(widths) == 1:  # the long prompt's first slice: another request arrives
            short.extend(engine.submit(SequenceRequest(served.name, short_ids, 0,
                                                       label_token_ids=(5,)), owner="short")
                         for _ in range(2))

    hook = served.model.register_forward_pre_hook(record, with_kwargs=True)
    try:  # never started: the test runs the worker's steps itself
        long = engine.submit(SequenceRequest(served.name, long_ids, 0, label_token_ids=(5,)),
                             owner="long")
        with torch.inference_mode():
            engine._step()
            assert long.done() and short[0].done() and not short[1].done()
            engine._step()
    finally:
        hook.remove()
        engine.close()
    assert widths == [16, len(short_ids), 16, len(long_ids) - 32, len(short_ids)]
    assert short[1].result().label_logprobs == short[0].result().label_logprobs


def test_a_client_gone_has_its_remaining_windows_dropped(
        server: LocalServer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=DISCONNECT_LOGGER)
    engine = server.engine
    entered, release = threading.Event(), threading.Event()
    real = engine._prefill
    rows: list[int] = []

    def held(name: str, chunk: list[Any], **options: Any) -> None:
        rows.append(len(chunk))
        entered.set()
        release.wait(timeout=60)
        real(name, chunk, **options)

    monkeypatch.setattr(engine, "_prefill", held)
    cancelled = engine.stats.cancelled
    body = json.dumps({"model": "filter", "query": QUERY, "documents": [LONG] * 3}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/rerank HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
                     b"application/json\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        assert entered.wait(timeout=120)
        windows = engine.in_flight
    wait_for(lambda: any(r.name == DISCONNECT_LOGGER for r in caplog.records),
             "the server to notice the disconnect")
    release.set()
    wait_for(lambda: engine.in_flight == 0, "the cancelled windows to leave")
    assert windows == 3 * server.config.rerank.max_windows_per_doc
    assert sum(rows) < windows  # the step under way ran; the rest were dropped unread
    assert engine.stats.cancelled - cancelled == windows


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll `condition` until it holds; the deadline only guards against a hang."""
    deadline = time.monotonic() + 120
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.005)


# ----- MCF's plan of a round: what the server checks is what MCF asks -----

def test_the_plan_counts_what_mcf_then_asks(server: LocalServer) -> None:
    """The filter tokens MCF's plan gives a round (what the 413 budget is checked against)
    are what the same MCF then reads on the engine: exactly, for documents of one window each
    (a blank one asks nothing); at least, for a long one read in several (its windows counted
    at their largest)."""
    def asked(documents: list[Document]) -> tuple[int, int]:
        backend = EngineBackend(server.engine, "filter")
        mcf = MultiGranularFilter(backend, server.config.rerank, card_combination(CARD))
        plan = plan_round(mcf, QUERY, documents)
        mcf.select(QUERY, documents)
        used = sum(u.prompt_tokens + u.completion_tokens for u in backend.meter.by_agent.values())
        return plan.tokens, used

    short = [Document(id="0", text=OTHER), Document(id="1", text=ANSWER),
             Document(id="2", text="   ")]
    planned, used = asked(short)
    # The plan budgets each chunk prompt's one-token answer, which a label read (the next
    # token's log-probabilities) does not generate: one for each of the two documents read.
    assert planned == used + 2 and used > 0
    planned, used = asked([Document(id="0", text=LONG), Document(id="1", text=OTHER)])
    assert planned >= used > 0


class CountingTokenizer:
    """The served tokenizer, counting the texts it is called on."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.texts: Counter[str] = Counter()

    def __call__(self, text: str, **kwargs: Any) -> Any:
        self.texts[text] += 1
        return self.tokenizer(text, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


def test_a_planned_round_tokenises_each_prompt_once(server: LocalServer) -> None:
    """Planning a round and then running it tokenise each prompt once: the plan asks the
    engine's backend (`read_ids`), which remembers what it tokenised for the round."""
    backend = EngineBackend(server.engine, "filter")
    counting = CountingTokenizer(backend.tokenizer)
    backend.tokenizer = counting
    mcf = MultiGranularFilter(backend, server.config.rerank, card_combination(CARD))
    documents = [Document(id="0", text=OTHER), Document(id="1", text=ANSWER)]
    plan_round(mcf, QUERY, documents)
    mcf.select(QUERY, documents)
    prompts = {text: n for text, n in counting.texts.items() if QUERY in text}
    assert prompts and max(prompts.values()) == 1, prompts
