"""OpenTelemetry spans of each request (serving/observability/tracing.py): the embedded server
on the tiny model with a random filter adapter, as a filtering proxy in front of the fake
OpenAI server, its spans caught by the SDK's in-memory exporter through the server's own
entry point (`LocalServer(config, tracer_provider=...)`, what `OTEL_EXPORTER_OTLP_ENDPOINT`
builds otherwise). A rerank request and a proxied request each make one trace: the route
span, the filter's steps with what they kept and why, and the forward to the generator under
OpenTelemetry's GenAI conventions. The real OTLP path is exercised against a collector on
127.0.0.1, and a server in a process where OpenTelemetry's SDK cannot be imported serves as
before."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from fake_openai_server import FakeOpenAIServer, Reply, chat_reply
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tiny_adapter import one_torch_thread  # noqa: F401 (autouse)

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.filters.mcf import MCFConfig
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.local_server import LocalServer
from sieverag.serving.observability.tracing import tracer_provider_from_env

QUESTION = "Where was Liora Tamsin born?"
DOCUMENTS = [
    "Liora Tamsin was born in Quorrin in 1848. She later worked as a cartographer. "
    "Her maps are kept in Ostmere.",
    "Penguins huddle together in winter. They live in the south.",
    "The Calder Bridge opened in 1901. It crosses a gorge. Its engineer was Wren Ivers.",
    "Quorrin is a port town. Liora Tamsin grew up there.",
]
LONG = " ".join([f"Filler sentence number {i} says very little of use." for i in range(40)]
                + ["Liora Tamsin was born in Quorrin, a port town."])
# The filter reads every chunk (the tiny adapter has no card, whose combination would leave
# it out), so the chunk_scores span is there to check.
RULES = MCFConfig(always_score_chunks=True)


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, adapter_dir: Path, upstream: FakeOpenAIServer,
           exporter: InMemorySpanExporter) -> Iterator[LocalServer]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = LocalServerConfig(model=str(tiny_model_dir), adapters=(f"filter={adapter_dir}",),
                               port=0, access_log=False, proxy_to=upstream.base_url,
                               rerank=RULES)
    with LocalServer(config, tracer_provider=provider) as running:
        yield running


@pytest.fixture()
def http(server: LocalServer, exporter: InMemorySpanExporter) -> Iterator[httpx.Client]:
    exporter.clear()
    with httpx.Client(base_url=server.base_url, timeout=600) as client:
        yield client


def trace_of(exporter: InMemorySpanExporter, route: str) -> list[ReadableSpan]:
    """The spans of the one request to `route`, once its route span has ended (it ends just
    after the answer's last byte is sent)."""
    deadline = time.monotonic() + 10
    while True:
        spans = exporter.get_finished_spans()
        roots = [s for s in spans if s.name == f"POST {route}"]
        if roots or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    (root,) = roots
    return [s for s in spans if s.context.trace_id == root.context.trace_id]


def named(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    (found,) = [s for s in spans if s.name == name]
    return found


def parent_of(spans: list[ReadableSpan], span: ReadableSpan) -> ReadableSpan:
    assert span.parent is not None
    (found,) = [s for s in spans if s.context.span_id == span.parent.span_id]
    return found


def test_a_rerank_request_is_one_trace_of_the_filters_steps(
        http: httpx.Client, exporter: InMemorySpanExporter) -> None:
    documents = [*DOCUMENTS, LONG]
    reply = http.post("/rerank", json={"model": "filter", "query": QUESTION,
                                       "documents": documents, "granularity": "sentence"})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    spans = trace_of(exporter, "/v1/rerank")

    route = named(spans, "POST /v1/rerank")
    assert route.kind == SpanKind.SERVER and route.parent is None
    assert route.attributes["http.route"] == "/v1/rerank"
    assert route.attributes["http.response.status_code"] == 200

    whole = named(spans, "sieverag.filter")
    assert parent_of(spans, whole) is route
    results = body["results"]
    kept = [r for r in results if r["kept"]]
    assert whole.attributes["gen_ai.request.model"] == "filter"
    assert (whole.attributes["gen_ai.usage.input_tokens"]
            + whole.attributes["gen_ai.usage.output_tokens"]) == body["usage"]["total_tokens"]
    assert whole.attributes["sieverag.documents.in"] == len(documents)
    assert whole.attributes["sieverag.documents.kept"] == len(kept)
    assert whole.attributes["sieverag.documents.windowed"] == 1
    assert whole.attributes["sieverag.bar.rule"] and whole.attributes["sieverag.bar.reason"]
    assert whole.attributes["sieverag.granularity"] == "sentence"
    assert whole.attributes["sieverag.sentences.kept"] == sum(
        len(r["key_sentences"]) for r in kept)
    assert whole.attributes["sieverag.sentences.in"] >= whole.attributes[
        "sieverag.sentences.kept"]

    windows = named(spans, "sieverag.filter.windows")
    assert parent_of(spans, windows) is whole
    assert windows.attributes["sieverag.documents.windowed"] == 1
    long_windows = windows.attributes["sieverag.windows.total"] - len(DOCUMENTS)
    assert long_windows > 1
    read = len(DOCUMENTS) + min(long_windows, RULES.max_windows_per_doc)
    assert windows.attributes["sieverag.windows.read"] == read

    chunks = named(spans, "sieverag.filter.chunk_stage")
    assert parent_of(spans, chunks) is whole
    assert chunks.attributes["sieverag.chunks.scored_by"] == "filter"
    assert chunks.attributes["sieverag.chunks.read"] == read
    scores = named(spans, "sieverag.filter.chunk_scores")
    assert parent_of(spans, scores) is chunks
    assert scores.attributes["sieverag.chunks.read"] == read
    bar = named(spans, "sieverag.filter.bar")
    assert parent_of(spans, bar) is chunks
    assert bar.attributes["sieverag.bar.rule"] == whole.attributes["sieverag.bar.rule"]
    assert bar.attributes["sieverag.bar.scores"] == len(documents)

    sentences = named(spans, "sieverag.filter.sentence_stage")
    assert parent_of(spans, sentences) is whole
    assert sentences.attributes["sieverag.sentences.in"] == whole.attributes[
        "sieverag.sentences.in"]
    assert sentences.attributes["sieverag.sentences.kept"] == whole.attributes[
        "sieverag.sentences.kept"]
    # The steps in order, each within the filter's span.
    assert windows.end_time <= chunks.start_time and chunks.end_time <= sentences.start_time
    assert whole.start_time <= windows.start_time and sentences.end_time <= whole.end_time


def test_a_clients_trace_is_continued(http: httpx.Client,
                                      exporter: InMemorySpanExporter) -> None:
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    reply = http.post("/rerank", json={"model": "filter", "query": QUESTION,
                                       "documents": DOCUMENTS[:2]},
                      headers={"traceparent": f"00-{trace_id}-{parent_id}-01"})
    assert reply.status_code == 200, reply.text
    spans = trace_of(exporter, "/v1/rerank")
    route = named(spans, "POST /v1/rerank")
    assert format(route.context.trace_id, "032x") == trace_id
    assert format(route.parent.span_id, "016x") == parent_id
    assert {s.name for s in spans} >= {"sieverag.filter", "sieverag.filter.chunk_stage"}


def test_a_proxied_request_traces_the_filter_and_the_forward(
        http: httpx.Client, exporter: InMemorySpanExporter, upstream: FakeOpenAIServer) -> None:
    upstream.script(Reply(body=chat_reply("Quorrin.", prompt_tokens=37, completion_tokens=3)))
    body = {"model": "generator", "temperature": 0, "max_tokens": 8,
            "messages": [{"role": "user", "content": QUESTION}], "documents": DOCUMENTS,
            "sieverag": {"context_tokens": 40}}
    reply = http.post("/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    info = reply.json()["sieverag"]
    spans = trace_of(exporter, "/v1/chat/completions")
    route = named(spans, "POST /v1/chat/completions")

    whole = named(spans, "sieverag.filter")
    assert parent_of(spans, whole) is route
    assert whole.attributes["sieverag.documents.in"] == len(DOCUMENTS)
    assert whole.attributes["sieverag.prompt_tokens_saved"] == info["prompt_tokens_saved"]
    assert whole.attributes["sieverag.documents.forwarded"] == info["documents_kept"]
    assert whole.attributes["sieverag.bar.rule"]
    budget = named(spans, "sieverag.context_budget")
    assert parent_of(spans, budget) is whole
    assert budget.attributes["sieverag.context_budget.tokens"] == 40
    assert budget.attributes["sieverag.context_budget.used"] == info["context_tokens_used"]
    assert budget.attributes["sieverag.context_budget.documents"] == info["documents_kept"]

    forward = named(spans, "chat generator")
    assert parent_of(spans, forward) is route and forward.kind == SpanKind.CLIENT
    assert whole.end_time <= forward.start_time
    attributes = forward.attributes
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "generator"
    assert attributes["gen_ai.request.max_tokens"] == 8
    assert attributes["gen_ai.request.temperature"] == 0
    assert attributes["gen_ai.request.stream"] is False
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["gen_ai.response.id"] == "chatcmpl-fake"
    assert tuple(attributes["gen_ai.response.finish_reasons"]) == ("stop",)
    assert attributes["gen_ai.usage.input_tokens"] == 37
    assert attributes["gen_ai.usage.output_tokens"] == 3
    assert attributes["http.response.status_code"] == 200
    # The generator is handed the forward span's context, to continue the trace.
    traceparent = upstream.requests[-1].headers["traceparent"]
    _, trace_id, span_id, _ = traceparent.split("-")
    assert int(trace_id, 16) == route.context.trace_id
    assert int(span_id, 16) == forward.context.span_id


def test_a_failed_forward_is_an_error_span(http: httpx.Client, exporter: InMemorySpanExporter,
                                           upstream: FakeOpenAIServer) -> None:
    upstream.script(Reply(status=500, body={"error": {"message": "boom"}}))
    reply = http.post("/chat/completions", json={
        "model": "generator", "messages": [{"role": "user", "content": QUESTION}]})
    assert reply.status_code == 500  # passed back as the upstream answered
    forward = named(trace_of(exporter, "/v1/chat/completions"), "chat generator")
    assert forward.status.status_code == StatusCode.ERROR
    assert forward.attributes["error.type"] == "500"


# ----- the OTLP path and the no-op -----

class _Collector(ThreadingHTTPServer):
    """An OTLP/HTTP receiver on 127.0.0.1: keeps every POST to /v1/traces."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    collector.bodies.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def test_otlp_endpoint_env_exports_each_requests_spans(
        tiny_model_dir: Path, adapter_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    collector = _Collector()
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT",
                           f"http://127.0.0.1:{collector.server_address[1]}")
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        config = LocalServerConfig(model=str(tiny_model_dir),
                                   adapters=(f"filter={adapter_dir}",), port=0,
                                   access_log=False)
        with LocalServer(config) as running, httpx.Client(timeout=600) as client:
            reply = client.post(f"{running.base_url}/rerank", json={
                "model": "filter", "query": QUESTION, "documents": DOCUMENTS[:2]})
            assert reply.status_code == 200, reply.text
        # Stopping the server sent what the batch processor held.
    finally:
        collector.shutdown()
        collector.server_close()
    names, services = set(), set()
    for body in collector.bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            services |= {a.value.string_value for a in resource_spans.resource.attributes
                         if a.key == "service.name"}
            names |= {s.name for scope in resource_spans.scope_spans for s in scope.spans}
    assert services == {"sieverag"}
    assert names >= {"POST /v1/rerank", "sieverag.filter", "sieverag.filter.windows",
                     "sieverag.filter.chunk_stage", "sieverag.filter.bar"}


def test_traces_are_off_without_the_variable_and_refused_without_the_sdk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert tracer_provider_from_env({}) is None
    with pytest.raises(ConfigError, match="http/protobuf"):
        tracer_provider_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                                  "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    # The extra not installed: its exporter cannot be imported.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                        None)
    with pytest.raises(ConfigError, match=r"pip install 'sieverag\[otel\]'"):
        tracer_provider_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})


def test_a_server_without_opentelemetry_serves_as_before(tiny_model_dir: Path,
                                                         adapter_dir: Path) -> None:
    """Without the variable, serving (a rerank at sentence granularity, through the filter's
    every step, under a budget) needs nothing of the otel extra: in a process where
    OpenTelemetry's SDK and exporters cannot be imported (the extra not installed; its API is
    FastAPI's own dependency, which FastAPI imports itself), the server starts and answers."""
    script = f"""
import importlib.abc, json, os, sys

class NoOpenTelemetry(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NoOpenTelemetry())
import httpx
os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
os.environ.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
from sieverag.serving.config import LocalServerConfig
from sieverag.serving.local_server import LocalServer
config = LocalServerConfig(model={str(tiny_model_dir)!r}, adapters=("filter={adapter_dir}",),
                           port=0, access_log=False)
with LocalServer(config) as server:
    reply = httpx.post(server.base_url + "/rerank", timeout=600, json={{
        "model": "filter", "query": "Who?", "documents": {json.dumps(DOCUMENTS)},
        "granularity": "sentence", "context_tokens": 30}})
    assert reply.status_code == 200, reply.text
    assert reply.json()["results"] and all(r["kept"] for r in reply.json()["results"])
print(json.dumps(sorted(m for m in sys.modules
                         if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter")))))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
