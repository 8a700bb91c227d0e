"""The embedded server (`sieverag serve --engine local`): transformers + PEFT behind FastAPI.

    with LocalServer(LocalServerConfig(model="smollm2-135m-instruct", port=0)) as server:
        ...  # an OpenAI client pointed at server.base_url

`run()` serves in the foreground until SIGINT or SIGTERM; on SIGTERM it drains first
(`DrainingServer`: new requests get 503 and /health turns unhealthy while the requests in
flight finish, for at most `drain_timeout_s`). `start()`/`stop()` (or a `with` block) serve
from a background thread, for tests and notebooks; `drain()` drains such a server. With
`proxy_to`, the chat endpoint is the filtering proxy (`proxy`), filtering with the adapter
`proxy_filter` names (default: the only adapter given, or the shipped filter when none is).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
from prometheus_client import start_http_server
from uvicorn.config import LOGGING_CONFIG

from sieverag.inference.core.errors import ConfigError
from sieverag.inference.filters.adapter_store import DEFAULT_FILTER_NAME
from sieverag.inference.filters.card.card_file import read_card
from sieverag.inference.filters.card.combination import card_combination
from sieverag.inference.filters.card.filter_card import ranking_statement
from sieverag.inference.llm.model_resolution import resolve_model
from sieverag.serving.adapters import Adapter, resolve_adapters
from sieverag.serving.api.middleware.auth import read_api_key
from sieverag.serving.api.middleware.concurrency import AdmissionState
from sieverag.serving.app import create_app
from sieverag.serving.config import LocalServerConfig, client_base_url
from sieverag.serving.engine.continuous_batching import BatchingEngine
from sieverag.serving.engine.served_model import load_served_model
from sieverag.serving.errors import ServerStartError
from sieverag.serving.listen import listening_socket, serve_in_thread
from sieverag.serving.observability.tracing import (
    ENDPOINT_ENV,
    TRACES_ENDPOINT_ENV,
    tracer_provider_from_env,
)
from sieverag.serving.proxy.chat_proxy import ProxyTarget
from sieverag.serving.proxy.upstream import Upstream

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

logger = logging.getLogger(__name__)

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Seconds the requests still in flight when a drain times out get before they are cancelled.
_PAST_DRAIN_S = 1.0


class DrainingServer(uvicorn.Server):
    """uvicorn's server that drains on SIGTERM (`drain`): it admits no new request (503,
    /health unhealthy) and stops once the requests in flight are answered, or once
    `drain_timeout_s` have passed (those left are cancelled). SIGINT, or a second SIGTERM,
    stops it at once, as uvicorn does."""

    def __init__(self, config: uvicorn.Config, admission: AdmissionState,
                 drain_timeout_s: float) -> None:
        super().__init__(config)
        self.admission = admission
        self.drain_timeout_s = drain_timeout_s
        self._drain_deadline: float | None = None

    def drain(self) -> None:
        """Admit nothing more; stop once the requests in flight are answered."""
        if self._drain_deadline is not None:
            return
        self.admission.drain()
        self._drain_deadline = time.monotonic() + self.drain_timeout_s
        logger.info("draining: new requests get 503; %d request(s) in flight get up to %g s "
                    "to finish", self.admission.in_flight, self.drain_timeout_s)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self.should_exit and self._drain_deadline is None:
            self._captured_signals.append(sig)  # uvicorn raises it again once stopped
            self.drain()
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        if self._drain_deadline is None:
            return False
        if self.admission.in_flight == 0:
            logger.info("drained: every request in flight was answered")
            return True
        if time.monotonic() >= self._drain_deadline:
            logger.warning("drain timeout (%g s, --drain-timeout-s): %d request(s) still in "
                           "flight are cancelled", self.drain_timeout_s,
                           self.admission.in_flight)
            self.config.timeout_graceful_shutdown = _PAST_DRAIN_S
            return True
        return False


class LocalServer:
    """Loads the model and adapters (in the constructor), then serves them over HTTP."""

    def __init__(self, config: LocalServerConfig,
                 tracer_provider: TracerProvider | None = None) -> None:
        """`tracer_provider`: where each request's OpenTelemetry spans go; None: OTLP to
        $OTEL_EXPORTER_OTLP_ENDPOINT where it is set (`tracer_provider_from_env`), else no
        traces."""
        self.config = config
        self._api_key = read_api_key(config.api_key_env)
        # Read before the model loads: traces asked for without the otel extra fail first.
        self._owns_tracing = tracer_provider is None
        self.tracer_provider = (tracer_provider if tracer_provider is not None
                                else tracer_provider_from_env())
        specs = config.adapters
        if config.proxy_to is not None and not specs:  # the proxy's default filter
            specs = (f"{DEFAULT_FILTER_NAME}={DEFAULT_FILTER_NAME}",)
        adapters = resolve_adapters(specs, base_name=config.model,
                                    base_model_dir=resolve_model(config.model))
        self.proxy = self._proxy_target(adapters)
        # Each adapter's filter card: what /v1/models shows, and the combination it ranks by.
        self.cards = {a.name: card for a in adapters if (card := read_card(a.path)) is not None}
        # Read before the model loads: a malformed card fails first.
        self.rankings = served_rankings((config.model, *(a.name for a in adapters)),
                                        self.cards)
        served = load_served_model(config.model, adapters, config.dtype, config.device)
        self.engine = BatchingEngine(served, max_batch_size=config.max_batch_size,
                                     batch_window_s=config.batch_window_ms / 1000,
                                     max_batch_tokens=config.max_batch_tokens)
        self.port = config.port
        self._server: DrainingServer | None = None
        self._thread: threading.Thread | None = None
        self._metrics_server: Any = None  # the --metrics-port HTTP server, while it serves

    def _proxy_target(self, adapters: tuple[Adapter, ...]) -> ProxyTarget | None:
        """Where --proxy-to forwards and the served adapter that filters; None without it."""
        config = self.config
        if config.proxy_to is None:
            return None
        names = [adapter.name for adapter in adapters]
        if config.proxy_filter is not None:
            if config.proxy_filter not in (config.model, *names):
                raise ConfigError(f"--proxy-filter {config.proxy_filter!r} is not served: name "
                                  f"one of {', '.join(names) or 'no adapter'} (--adapters)")
            filter_model = config.proxy_filter
        elif len(names) == 1:
            filter_model = names[0]
        else:
            raise ConfigError(f"--proxy-to with {len(names)} adapters: name the one that "
                              f"filters with --proxy-filter (one of {', '.join(names)})")
        upstream_key = read_api_key(config.proxy_api_key_env, "--proxy-api-key-env")
        upstream = Upstream(config.proxy_to, config.proxy_model, config.proxy_timeout,
                            api_key=upstream_key, forward_client_key=self._api_key is None)
        return ProxyTarget(upstream, filter_model, config.proxy_context_tokens)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. http://127.0.0.1:8000/v1 (the bound port once started)."""
        return client_base_url(self.config.host, self.port)

    def run(self) -> None:
        """Serve in the foreground until SIGINT or SIGTERM (which drains first), then shut
        down cleanly."""
        server, sock = self._prepare(log_config=LOGGING_CONFIG)
        self._server = server
        freeze_loaded_objects()
        self.engine.start()
        # uvicorn re-raises the signal that stopped it once it is done; these handlers
        # swallow that, so a served-then-stopped server exits normally.
        stops = {sig: signal.signal(sig, lambda *_: None)
                 for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._announce()
            server.run(sockets=[sock])
        finally:
            for sig, handler in stops.items():
                signal.signal(sig, handler)
            self._stop_metrics_server()
            self._end_tracing()
            self.engine.close()
            sock.close()
            self._server = None

    def start(self, timeout_s: float = 30.0) -> LocalServer:
        """Serve from a background thread; returns once the server accepts connections."""
        server, sock = self._prepare(log_config=None)
        self.engine.start()
        self._server = server
        self._thread = serve_in_thread(server, sock, thread_name="sieverag-server",
                                       what=f"the embedded server on {self.base_url}",
                                       timeout_s=timeout_s, on_failure=self.stop)
        self._announce()
        return self

    def drain(self) -> None:
        """Drain the server started with `start()`, as SIGTERM drains `run()`'s: new
        requests get 503 and /health 503; it stops serving once the requests in flight are
        answered (or `drain_timeout_s` passed). `stop()` then releases the rest."""
        if self._server is not None:
            self._server.drain()

    def stop(self) -> None:
        """Stop serving (finishing requests in flight) and release the model's worker."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join()
            self._server = self._thread = None
        self._stop_metrics_server()
        self._end_tracing()
        self.engine.close()

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _prepare(self, log_config: dict | None) -> tuple[uvicorn.Server, socket.socket]:
        sock = listening_socket(self.config.host, self.config.port)
        self.port = sock.getsockname()[1]
        metrics_port = self.config.metrics_port
        app = create_app(self.engine, self.config, api_key=self._api_key, proxy=self.proxy,
                         cards=self.cards, metrics_route=metrics_port is None,
                         tracer_provider=self.tracer_provider)
        if metrics_port is not None:
            try:
                self._metrics_server, _ = start_http_server(
                    metrics_port, addr=self.config.host, registry=app.state.metrics.registry)
            except OSError as exc:
                sock.close()
                raise ServerStartError(f"cannot serve metrics on {self.config.host}:"
                                       f"{metrics_port}: {exc.strerror or exc}; pick another "
                                       "--metrics-port") from exc
        config = uvicorn.Config(app, log_level=self.config.log_level,
                                access_log=self.config.access_log, log_config=log_config,
                                timeout_graceful_shutdown=self.config.drain_timeout_s)
        return DrainingServer(config, app.state.admission, self.config.drain_timeout_s), sock

    def _end_tracing(self) -> None:
        """Send the spans not yet exported; the provider the server made is shut down."""
        if self.tracer_provider is None:
            return
        if self._owns_tracing:
            self.tracer_provider.shutdown()
        else:
            self.tracer_provider.force_flush()

    def _stop_metrics_server(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None

    def _announce(self) -> None:
        names = ", ".join(self.engine.served.names)
        auth = f"bearer key from ${self.config.api_key_env}" if self._api_key else "no API key"
        logger.info("serving %s at %s (%s)", names, self.base_url, auth)
        if self.proxy is not None:
            logger.info("proxying /v1/chat/completions to %s, filtering marked documents with "
                        "%s", self.proxy.upstream.chat_url, self.proxy.filter_model)
        for name, (fitted, statement) in self.rankings.items():
            # Unfitted (the filter alone, or retrieval alone without a card) is warned of.
            logger.log(logging.INFO if fitted else logging.WARNING,
                       "/v1/rerank, /v1/score and the proxy for %s: %s", name, statement)
        if self.tracer_provider is not None and self._owns_tracing:
            logger.info("OpenTelemetry traces of each request to %s (OTLP over HTTP)",
                        os.environ.get(TRACES_ENDPOINT_ENV) or os.environ.get(ENDPOINT_ENV))
        if self.config.metrics_port is not None:
            logger.info("Prometheus metrics at http://%s:%d/metrics (no API key)",
                        self.config.host, self.config.metrics_port)
        if self.config.host not in _LOOPBACK and not self._api_key:
            logger.warning("listening on %s without an API key: anyone who can reach it can use "
                           "the model; set --api-key-env", self.config.host)


def served_rankings(names: Sequence[str], cards: Mapping[str, Mapping[str, Any]]
                    ) -> dict[str, tuple[bool, str]]:
    """For each served model (`names`: the base model, then the adapters), whether
    /v1/rerank, /v1/score and the proxy rank its documents by a fitted combination, and the
    line that says what they rank by and why (`filter_card.ranking_statement`): a card's
    combination; a card without one, the filter alone; no card, BM25 + dense alone."""
    rankings = {}
    for name in names:
        where = f"the card of {name!r}" if name in cards else f"{name!r} has no filter card"
        combination = card_combination(cards.get(name), where)
        rankings[name] = (combination.fitted, ranking_statement(combination, where))
    return rankings


def freeze_loaded_objects() -> int:
    """Move every object alive now (the model, transformers, the app: ~400k objects) out of
    the garbage collector's reach; returns how many. A full collection over them holds the
    GIL ~200 ms on 2 cores, and one fell due every few minutes under load: it stalled /health
    and every client (worst /health 230-290 ms in `bench_server_abuse.py`'s load). Only what
    requests create afterwards is traversed. For the foreground server process only: it
    changes the whole interpreter's collector."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()

