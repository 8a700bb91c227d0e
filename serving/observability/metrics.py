"""The embedded server's Prometheus metrics, named in vLLM's style (`sieverag:...`).

Each app has its own `CollectorRegistry` (`ServerMetrics`), never prometheus_client's global
one, so two servers in one process (tests, a notebook) count apart. GET /metrics
(`serving.api.metrics_route`) serves it in Prometheus's text format; `--metrics-port` serves it on a
port of its own instead.

What is counted, and where it is counted (the place that knows the fact):

* requests (`api/middleware/request_metrics.py`, outermost, so a 401 or a 429 is counted too):
  `sieverag:http_requests_total{route,status}`, `sieverag:http_request_duration_seconds{route}`
  (until the last byte of the response, a stream's too), `sieverag:request_refusals_total
  {route,reason}` (400 invalid_request, 401 unauthorized, 404 not_found, 413 too_large, 429
  overloaded, 503 unavailable: draining or the engine stopped; status 499 is a client that
  went away before its answer, not a refusal);
* admission (`api/middleware/concurrency.py`): `sieverag:requests_in_flight` (the requests
  holding one of `--local.max-concurrent-requests` slots, a stream until it ends),
  `sieverag:max_concurrent_requests`, `sieverag:draining` (1 once SIGTERM was received);
* the engine (`engine/continuous_batching.py`, `EngineMetrics`):
  `sieverag:num_sequences_waiting` and `sieverag:num_tokens_waiting` (sequences submitted and
  not yet prefilled, e.g. filter windows, and their prompt tokens),
  `sieverag:num_sequences_running`, `sieverag:batch_size{kind="prefill"|"decode"}` (sequences
  per forward pass),
  `sieverag:prompt_tokens_total` (tokens prefilled), `sieverag:generation_tokens_total`, and
  each sequence's wait and work: `sieverag:sequence_queue_time_seconds` (submitted until its
  prefill pass starts) and `sieverag:sequence_inference_time_seconds` (from then until it
  finishes);
* the filter (`record_filter`, from MCF's result on /v1/rerank, /v2/rerank, /v1/score and
  the proxy, label `endpoint`): `sieverag:filter_passages_total` and
  `sieverag:filter_passages_kept_total`, `sieverag:filter_sentences_total` and
  `sieverag:filter_sentences_kept_total` (the sentences of the passages the sentence stage
  read, and their key sentences), `sieverag:filter_rounds_total{bar_rule}` (which rule set
  the round's bar: calibrated, shift_guard, top_k, fixed, adaptive),
  `sieverag:filter_documents_windowed_total` (documents longer than the filter's window,
  read window by window);
* the proxy (`record_proxy`): `sieverag:proxy_prompt_tokens_unfiltered_total` (the tokens of
  the marked documents' block the generator would have read unfiltered),
  `sieverag:proxy_prompt_tokens_forwarded_total` (those of the block it was sent) and
  `sieverag:proxy_prompt_tokens_saved_total` (the difference), counted with the filter's
  tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from sieverag.inference.core.types import Document
from sieverag.inference.filters.document_filter import FilterResult
from sieverag.inference.filters.mcf import document_sentences
from sieverag.inference.retrieval.sentences import split_sentences

# Seconds: from a /health answer (milliseconds) to a long rerank on CPU (minutes).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0, 600.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# A refusal's reason by its status (any other 4xx: "other"); 499 (the client went away) is
# not a refusal.
REFUSAL_REASONS = {400: "invalid_request", 401: "unauthorized", 404: "not_found",
                   413: "too_large", 429: "overloaded", 503: "unavailable"}
CLIENT_GONE = 499


def refusal_reason(status: int) -> str | None:
    """The refusal reason of a response `status` (None: not a refusal)."""
    if status in REFUSAL_REASONS:
        return REFUSAL_REASONS[status]
    return "other" if 400 <= status < 500 and status != CLIENT_GONE else None


@dataclass(frozen=True)
class QueueDepth:
    """The engine's work now: sequences waiting to be prefilled, their prompt tokens, and
    sequences running (decoding)."""

    waiting: int
    waiting_tokens: int
    running: int


class EngineMetrics:
    """What one `BatchingEngine` counts as it works; registered into each app's registry that
    serves the engine (`ServerMetrics.watch_engine`)."""

    def __init__(self) -> None:
        self.batch_size = Histogram(
            "sieverag:batch_size", "Sequences per forward pass of the engine, by kind.",
            ["kind"], buckets=BATCH_BUCKETS, registry=None)
        self.prompt_tokens = Counter(
            "sieverag:prompt_tokens", "Prompt tokens prefilled (without padding).",
            registry=None)
        self.generation_tokens = Counter(
            "sieverag:generation_tokens", "Tokens generated.", registry=None)
        self.queue_time = Histogram(
            "sieverag:sequence_queue_time_seconds",
            "Seconds a sequence waited, from its submission until its prefill pass started.",
            buckets=LATENCY_BUCKETS, registry=None)
        self.inference_time = Histogram(
            "sieverag:sequence_inference_time_seconds",
            "Seconds a sequence was worked on, from its prefill pass until it finished.",
            buckets=LATENCY_BUCKETS, registry=None)

    def collectors(self) -> tuple[Counter | Histogram, ...]:
        return (self.batch_size, self.prompt_tokens, self.generation_tokens, self.queue_time,
                self.inference_time)


class _QueueCollector:
    """The engine's queue depth, read when /metrics is scraped."""

    def __init__(self, read: Callable[[], QueueDepth]) -> None:
        self.read = read

    def describe(self) -> list[Metric]:
        return list(self._families(QueueDepth(0, 0, 0)))

    def collect(self) -> Iterator[Metric]:
        return self._families(self.read())

    @staticmethod
    def _families(depth: QueueDepth) -> Iterator[Metric]:
        yield GaugeMetricFamily("sieverag:num_sequences_waiting",
                                "Sequences submitted to the engine and not yet prefilled.",
                                value=depth.waiting)
        yield GaugeMetricFamily("sieverag:num_tokens_waiting",
                                "Prompt tokens of the sequences waiting.",
                                value=depth.waiting_tokens)
        yield GaugeMetricFamily("sieverag:num_sequences_running",
                                "Sequences prefilled and still generating.",
                                value=depth.running)


class ServerMetrics:
    """One app's metrics, in a registry of its own (`registry`)."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "sieverag:http_requests", "HTTP requests answered, by route and status.",
            ["route", "status"], registry=registry)
        self.request_seconds = Histogram(
            "sieverag:http_request_duration_seconds",
            "Seconds from a request's arrival to the last byte of its response.", ["route"],
            buckets=LATENCY_BUCKETS, registry=registry)
        self.refusals = Counter(
            "sieverag:request_refusals", "Requests refused, by route and reason.",
            ["route", "reason"], registry=registry)
        self.passages = Counter(
            "sieverag:filter_passages", "Passages (documents) the filter judged.",
            ["endpoint"], registry=registry)
        self.passages_kept = Counter(
            "sieverag:filter_passages_kept", "Passages the filter kept.", ["endpoint"],
            registry=registry)
        self.sentences = Counter(
            "sieverag:filter_sentences",
            "Sentences of the kept passages the sentence stage read.", ["endpoint"],
            registry=registry)
        self.sentences_kept = Counter(
            "sieverag:filter_sentences_kept", "Key sentences the sentence stage kept.",
            ["endpoint"], registry=registry)
        self.rounds = Counter(
            "sieverag:filter_rounds", "Filter rounds, by the rule that set the round's bar.",
            ["endpoint", "bar_rule"], registry=registry)
        self.windowed = Counter(
            "sieverag:filter_documents_windowed",
            "Documents longer than the filter's window, read window by window.", ["endpoint"],
            registry=registry)
        self.proxy_unfiltered = Counter(
            "sieverag:proxy_prompt_tokens_unfiltered",
            "Tokens of the marked documents' block the generator would have read unfiltered.",
            registry=registry)
        self.proxy_forwarded = Counter(
            "sieverag:proxy_prompt_tokens_forwarded",
            "Tokens of the documents' block the generator was sent.", registry=registry)
        self.proxy_saved = Counter(
            "sieverag:proxy_prompt_tokens_saved",
            "Generator prompt tokens the filter saved (unfiltered less forwarded).",
            registry=registry)

    def watch_engine(self, engine: EngineMetrics, queue_depth: Callable[[], QueueDepth]
                     ) -> None:
        """Serve `engine`'s metrics and its queue depth (read at each scrape)."""
        for collector in engine.collectors():
            self.registry.register(collector)
        self.registry.register(_QueueCollector(queue_depth))

    def watch_admission(self, in_flight: Callable[[], int], limit: int,
                        draining: Callable[[], bool]) -> None:
        """Serve the requests in flight against the concurrency `limit`, and the drain."""
        Gauge("sieverag:requests_in_flight",
              "Requests holding a concurrency slot (a stream until it ends).",
              registry=self.registry).set_function(in_flight)
        Gauge("sieverag:max_concurrent_requests",
              "Requests served at once; more are answered 429 (--local.max-concurrent-requests).",
              registry=self.registry).set(limit)
        Gauge("sieverag:draining", "1 once the server drains (SIGTERM): new requests get 503.",
              registry=self.registry).set_function(lambda: float(draining()))

    def record_request(self, route: str, status: int, seconds: float) -> None:
        """One request answered `status` after `seconds`."""
        self.requests.labels(route, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)
        reason = refusal_reason(status)
        if reason is not None:
            self.refusals.labels(route, reason).inc()

    def record_filter(self, endpoint: str, documents: Sequence[Document],
                      result: FilterResult) -> None:
        """One filter round's verdicts (`result`, MCF's) on `documents` (none: no round)."""
        if not documents:
            return
        self.passages.labels(endpoint).inc(len(documents))
        self.passages_kept.labels(endpoint).inc(len(result.kept))
        self.rounds.labels(endpoint, result.rule or "none").inc()
        self.windowed.labels(endpoint).inc(
            sum(1 for s in result.scored if s.details.get("windows", 0) > 1))
        read, kept = sentence_counts(documents, result)
        self.sentences.labels(endpoint).inc(read)
        self.sentences_kept.labels(endpoint).inc(kept)

    def record_proxy(self, unfiltered_tokens: int, forwarded_tokens: int) -> None:
        """One proxied request's documents block: its tokens unfiltered and as forwarded."""
        self.proxy_unfiltered.inc(unfiltered_tokens)
        self.proxy_forwarded.inc(forwarded_tokens)
        self.proxy_saved.inc(unfiltered_tokens - forwarded_tokens)

    def exposition(self) -> bytes:
        """Every metric in Prometheus's text format."""
        return generate_latest(self.registry)


def sentence_counts(documents: Sequence[Document], result: FilterResult) -> tuple[int, int]:
    """The sentences the sentence stage read (those of each passage it narrowed: MCF's split
    of the passage, or of the window it judged a long document by) and the key sentences it
    kept of them; (0, 0) where no sentence stage ran. `result.scored` is in `documents`'
    order."""
    read = kept = 0
    for document, scored in zip(documents, result.scored, strict=True):
        keys = scored.details.get("key_sentences")
        if keys is None:
            continue
        window = scored.details.get("window")
        read += (len(split_sentences(document.text[window[0]:window[1]])) if window
                 else len(document_sentences(document)))
        kept += len(keys) if scored.kept else 0
    return read, kept
