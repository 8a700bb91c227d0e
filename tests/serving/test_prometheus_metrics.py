"""GET /metrics on the embedded server (tiny random model and a random LoRA adapter), scraped
with prometheus_client's own parser: each counter moves by what a request did (its route and
status, the engine's tokens and passes, the filter's passages, sentences, bar rule and long
documents, the proxy's tokens saved), refusals are counted by reason, the metrics sit under
the API key, and a second server in the same process counts apart (`--metrics-port`)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fake_openai_server import FakeOpenAIServer
from prometheus_client.parser import text_string_to_metric_families
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)
from tiny_server import keyed_filter_server, keyed_http

from sieverag.inference.core.types import Document
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.local_server import LocalServer
from sieverag.serving.proxy.marked_documents import Passage, documents_block

KEY_ENV, KEY = "SIEVERAG_METRICS_TEST_KEY", "sk-metrics"
QUERY = "Where was Liora Tamsin born?"
TEXTS = [
    "Liora Tamsin was born in Quorrin in 1848. She later worked as a cartographer. "
    "Her maps are kept in Ostmere.",
    "Penguins huddle together in winter.",
    "The Calder Bridge opened in 1901. It crosses a gorge. Its engineer was Wren Ivers.",
    "Quorrin is a port town. Liora Tamsin grew up there.",
    "Tea is grown on terraced hills.",
]
# Longer than the filter's window (256 tokens without a card): read window by window.
LONG = " ".join(f"Filler sentence number {i} says very little of use." for i in range(60))
MAX_BYTES = 64 * 1024
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, adapter_dir: Path) -> Iterator[LocalServer]:
    with keyed_filter_server(tiny_model_dir, adapter_dir, KEY_ENV, KEY,
                             max_request_bytes=MAX_BYTES) as running:
        yield running


@pytest.fixture()
def http(server: LocalServer) -> Iterator[httpx.Client]:
    with keyed_http(server, KEY) as client:
        yield client


def parse(text: str) -> Samples:
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def scrape(http: httpx.Client) -> Samples:
    reply = http.get("/metrics")
    assert reply.status_code == 200, reply.text
    return parse(reply.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_metrics_are_prometheus_text_under_the_api_key(server: LocalServer,
                                                       http: httpx.Client) -> None:
    before = scrape(http)
    assert httpx.get(server.base_url.removesuffix("/v1") + "/metrics").status_code == 401
    reply = http.get("/metrics")
    assert reply.headers["content-type"].startswith("text/plain")
    families = {family.name for family in text_string_to_metric_families(reply.text)}
    assert {
        "sieverag:http_requests", "sieverag:http_request_duration_seconds",
        "sieverag:request_refusals", "sieverag:requests_in_flight",
        "sieverag:max_concurrent_requests", "sieverag:draining",
        "sieverag:num_sequences_waiting", "sieverag:num_tokens_waiting",
        "sieverag:num_sequences_running", "sieverag:batch_size", "sieverag:prompt_tokens",
        "sieverag:generation_tokens", "sieverag:sequence_queue_time_seconds",
        "sieverag:sequence_inference_time_seconds", "sieverag:filter_passages",
        "sieverag:filter_passages_kept", "sieverag:filter_sentences",
        "sieverag:filter_sentences_kept", "sieverag:filter_rounds",
        "sieverag:filter_documents_windowed", "sieverag:proxy_prompt_tokens_unfiltered",
        "sieverag:proxy_prompt_tokens_forwarded", "sieverag:proxy_prompt_tokens_saved",
    } <= families
    after = parse(reply.text)
    # The scrape without the key was refused and counted; a scrape is never in flight.
    assert moved(before, after, "sieverag:request_refusals_total", route="/metrics",
                 reason="unauthorized") == 1
    assert moved(before, after, "sieverag:http_requests_total", route="/metrics",
                 status="200") == 1
    assert value(after, "sieverag:max_concurrent_requests") == 512
    assert value(after, "sieverag:requests_in_flight") == 0
    assert value(after, "sieverag:draining") == 0


def test_a_completion_moves_the_request_and_engine_counters(server: LocalServer,
                                                            http: httpx.Client) -> None:
    before = scrape(http)
    reply = http.post("/v1/completions", json={
        "model": server.engine.served.name, "prompt": "The river carried small boats",
        "max_tokens": 4, "temperature": 0})
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    after = scrape(http)
    assert moved(before, after, "sieverag:http_requests_total", route="/v1/completions",
                 status="200") == 1
    assert moved(before, after, "sieverag:http_request_duration_seconds_count",
                 route="/v1/completions") == 1
    assert moved(before, after, "sieverag:prompt_tokens_total") == usage["prompt_tokens"]
    assert moved(before, after, "sieverag:generation_tokens_total") == usage[
        "completion_tokens"]
    # One prefill pass of one sequence picks the first token; each other token is a step.
    assert moved(before, after, "sieverag:batch_size_count", kind="prefill") == 1
    assert moved(before, after, "sieverag:batch_size_sum", kind="prefill") == 1
    assert moved(before, after, "sieverag:batch_size_count", kind="decode") == usage[
        "completion_tokens"] - 1
    assert moved(before, after, "sieverag:sequence_queue_time_seconds_count") == 1
    assert moved(before, after, "sieverag:sequence_inference_time_seconds_count") == 1
    for gauge in ("num_sequences_waiting", "num_tokens_waiting", "num_sequences_running"):
        assert value(after, f"sieverag:{gauge}") == 0


def test_rerank_counts_passages_kept_sentences_and_the_bar_rule(http: httpx.Client) -> None:
    before = scrape(http)
    reply = http.post("/v1/rerank", json={"model": "filter", "query": QUERY,
                                          "documents": TEXTS, "return_spans": True})
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    after = scrape(http)
    kept = [r for r in results if r["kept"]]
    assert moved(before, after, "sieverag:filter_passages_total", endpoint="rerank") == 5
    assert moved(before, after, "sieverag:filter_passages_kept_total",
                 endpoint="rerank") == len(kept)
    # Without a card's fitted combination, MCF's bar is top_k's (test_rerank.py).
    assert moved(before, after, "sieverag:filter_rounds_total", endpoint="rerank",
                 bar_rule="top_k") == 1
    # The sentence stage read the kept passages' sentences and kept their key sentences.
    assert moved(before, after, "sieverag:filter_sentences_total", endpoint="rerank") == sum(
        len(r["spans"]) for r in kept)
    assert moved(before, after, "sieverag:filter_sentences_kept_total",
                 endpoint="rerank") == sum(len(r["key_sentences"]) for r in kept) > 0
    assert moved(before, after, "sieverag:filter_documents_windowed_total",
                 endpoint="rerank") == 0
    # The filter read every chunk on the engine (always_score_chunks): it prefilled them.
    assert moved(before, after, "sieverag:prompt_tokens_total") > 0


def test_a_long_document_counts_as_windowed_and_score_as_its_own_endpoint(
        http: httpx.Client) -> None:
    before = scrape(http)
    reply = http.post("/v1/rerank", json={"model": "filter", "query": QUERY,
                                          "documents": [LONG, *TEXTS[:2]]})
    assert reply.status_code == 200, reply.text
    scored = http.post("/v1/score", json={"model": "filter", "text_1": QUERY,
                                          "text_2": TEXTS[:3]})
    assert scored.status_code == 200, scored.text
    after = scrape(http)
    assert moved(before, after, "sieverag:filter_documents_windowed_total",
                 endpoint="rerank") == 1
    assert moved(before, after, "sieverag:filter_passages_total", endpoint="rerank") == 3
    assert moved(before, after, "sieverag:filter_sentences_total", endpoint="rerank") == 0
    assert moved(before, after, "sieverag:filter_passages_total", endpoint="score") == 3
    assert moved(before, after, "sieverag:filter_passages_kept_total", endpoint="score") == sum(
        d["kept"] for d in scored.json()["data"])


def test_refusals_are_counted_by_route_and_reason(server: LocalServer,
                                                  http: httpx.Client) -> None:
    before = scrape(http)
    assert http.post("/v1/rerank", content=b"{not json",
                     headers={"content-type": "application/json"}).status_code == 400
    assert http.post("/v1/rerank", json={"model": "filter", "query": QUERY,
                                         "documents": ["x" * MAX_BYTES]}).status_code == 413
    assert http.post("/v1/rerank", json={"model": "nope", "query": QUERY,
                                         "documents": TEXTS}).status_code == 404
    assert httpx.post(f"{server.base_url}/rerank", json={}).status_code == 401
    assert http.get("/no/such/path").status_code == 404
    after = scrape(http)
    for reason, status in (("invalid_request", "400"), ("too_large", "413"),
                           ("not_found", "404"), ("unauthorized", "401")):
        assert moved(before, after, "sieverag:request_refusals_total", route="/v1/rerank",
                     reason=reason) == 1, reason
        assert moved(before, after, "sieverag:http_requests_total", route="/v1/rerank",
                     status=status) == 1, status
    # A path no route serves is counted as "other": a client cannot grow the label set.
    assert moved(before, after, "sieverag:http_requests_total", route="other",
                 status="404") == 1
    assert value(after, "sieverag:http_requests_total", route="/no/such/path",
                 status="404") == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_proxy_counts_the_tokens_saved_on_its_own_metrics_port(
        tiny_model_dir: Path, adapter_dir: Path, server: LocalServer) -> None:
    """A second server in this process (the proxy) counts in a registry of its own, served
    on --metrics-port without a key; /metrics is not on its main port."""
    metrics_port = _free_port()
    with FakeOpenAIServer() as upstream, LocalServer(LocalServerConfig(
            model=str(tiny_model_dir), adapters=(f"filter={adapter_dir}",), port=0,
            access_log=False, proxy_to=upstream.base_url,
            metrics_port=metrics_port)) as proxy:
        root = proxy.base_url.removesuffix("/v1")
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        assert httpx.get(f"{root}/metrics").status_code == 404
        before = parse(httpx.get(metrics_url).text)
        reply = httpx.post(f"{proxy.base_url}/chat/completions", timeout=120, json={
            "model": "generator", "max_tokens": 8, "documents": TEXTS,
            "messages": [{"role": "user", "content": QUERY}]})
        assert reply.status_code == 200, reply.text
        info = reply.json()["sieverag"]
        after = parse(httpx.get(metrics_url).text)
        tokenizer = proxy.engine.served.tokenizer
    block = documents_block([Passage(str(i + 1), Document(id=str(i), text=t))
                             for i, t in enumerate(TEXTS)])
    unfiltered = len(tokenizer(block, add_special_tokens=False)["input_ids"])
    assert moved(before, after, "sieverag:proxy_prompt_tokens_unfiltered_total") == unfiltered
    assert moved(before, after, "sieverag:proxy_prompt_tokens_saved_total") == info[
        "prompt_tokens_saved"] > 0
    assert moved(before, after, "sieverag:proxy_prompt_tokens_forwarded_total") == (
        unfiltered - info["prompt_tokens_saved"])
    assert moved(before, after, "sieverag:filter_passages_total", endpoint="proxy") == 5
    assert moved(before, after, "sieverag:filter_passages_kept_total", endpoint="proxy") == info[
        "documents_kept"]
    assert moved(before, after, "sieverag:http_requests_total", route="/v1/chat/completions",
                 status="200") == 1
    # The module's server counted none of the proxy's work, nor the proxy any of its own.
    assert value(after, "sieverag:http_requests_total", route="/v1/rerank", status="200") == 0
    with httpx.Client(base_url=server.base_url.removesuffix("/v1"),
                      headers={"Authorization": f"Bearer {KEY}"}) as client:
        assert value(scrape(client), "sieverag:filter_passages_total", endpoint="proxy") == 0
