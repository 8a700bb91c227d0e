"""Binding a server's listening socket, for every server here (`sieverag serve`, `sieverag
index serve`)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import uvicorn

from sieverag.serving.errors import ServerStartError


def listening_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one, read back with getsockname).

    It listens at once, so the announced URL accepts connections (queued until uvicorn
    serves them): a caller that started the server on port 0 can read the port and connect.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: a response's head and body go out at once, instead of
    # the body waiting for the client's delayed ACK of the head (~40 ms a request on Linux).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
        sock.listen()
    except OSError as exc:
        sock.close()
        raise ServerStartError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick "
                               "another --port or --host") from exc
    return sock


def serve_in_thread(server: uvicorn.Server, sock: socket.socket, *, thread_name: str,
                    what: str, timeout_s: float, on_failure: Callable[[], None]
                    ) -> threading.Thread:
    """Run `server` on `sock` from a daemon thread; return it once the server accepts
    connections. A server that dies or is not up within `timeout_s` is told to exit, then
    `on_failure()` (the caller's clean-up) runs and one error naming `what` ("the index server on http://...")."""
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name=thread_name, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(timeout=5)
            on_failure()
            raise ServerStartError(f"{what} did not start within {timeout_s} s; see the log "
                                   "above")
        time.sleep(0.01)
    return thread
