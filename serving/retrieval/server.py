"""`RetrievalServer`: one index served over HTTP (`sieverag index serve`).

    with RetrievalServer(index, RetrievalServerConfig(index=str(folder), port=0)) as server:
        ...  # RemoteIndex(server.url), or POST server.url + "/retrieve"

`run()` serves in the foreground until SIGINT/SIGTERM; `start()`/`stop()` (or a `with` block)
serve from a background thread, for tests and benchmarks.
"""

from __future__ import annotations

import logging
import signal
import threading

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from sieverag.inference.retrieval.search_backend import SearchBackend
from sieverag.serving.api.middleware.auth import read_api_key
from sieverag.serving.listen import listening_socket, serve_in_thread
from sieverag.serving.retrieval.config import RetrievalServerConfig
from sieverag.serving.retrieval.retrieval_app import create_retrieval_app

logger = logging.getLogger(__name__)

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def load_served_index(config: RetrievalServerConfig) -> SearchBackend:
    """The index folder `config` names, loaded with its search settings."""
    from sieverag.inference.retrieval.chooser import open_backend
    from sieverag.inference.retrieval.search_backend import IndexSource

    return open_backend(IndexSource(index=config.index), config.search, use_cache=config.cache)


class RetrievalServer:
    """Serves `index` (a loaded index) as `config` says."""

    def __init__(self, index: SearchBackend, config: RetrievalServerConfig) -> None:
        self.index = index
        self.config = config
        self._api_key = read_api_key(config.api_key_env)
        self.app = create_retrieval_app(index, config, api_key=self._api_key)
        self.port = config.port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The server's base URL, e.g. http://127.0.0.1:8000 (the bound port once started)."""
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def run(self) -> None:
        """Serve in the foreground until SIGINT or SIGTERM."""
        server, sock = self._prepare(LOGGING_CONFIG)
        stops = {sig: signal.signal(sig, lambda *_: None)
                 for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._announce()
            server.run(sockets=[sock])
        finally:
            for sig, handler in stops.items():
                signal.signal(sig, handler)
            sock.close()

    def start(self, timeout_s: float = 30.0) -> RetrievalServer:
        """Serve from a background thread; returns once the server accepts connections."""
        server, sock = self._prepare(None)
        self._server = server
        self._thread = serve_in_thread(server, sock, thread_name="sieverag-index-server",
                                       what=f"the index server on {self.url}",
                                       timeout_s=timeout_s, on_failure=self.stop)
        self._announce()
        return self

    def stop(self) -> None:
        """Stop serving (finishing requests in flight)."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join()
            self._server = self._thread = None

    def __enter__(self) -> RetrievalServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _prepare(self, log_config: dict | None) -> tuple[uvicorn.Server, object]:
        sock = listening_socket(self.config.host, self.config.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level=self.config.log_level,
                                access_log=self.config.access_log, log_config=log_config,
                                timeout_graceful_shutdown=30)
        return uvicorn.Server(config), sock

    def _announce(self) -> None:
        manifest = self.index.manifest
        auth = f"bearer key from ${self.config.api_key_env}" if self._api_key else "no API key"
        logger.info("serving index %s (%d chunks; modes %s; /retrieve in mode %s) at %s (%s)",
                    self.config.index, manifest.chunk_count, ", ".join(self.index.modes),
                    self.app.state.searcher.mode, self.url, auth)
        if self.config.host not in _LOOPBACK and not self._api_key:
            logger.warning("listening on %s without an API key: anyone who can reach it can "
                           "search the index; set --api-key-env", self.config.host)

