"""Binding a server's listening socket, for every server here (`sieverag serve`, `sieverag
index serve`)."""

from __future__ import annotations

import socket

from sieverag.serving.errors import ServerStartError


def listening_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one, read back with getsockname).

    It listens at once, so the announced URL accepts connections (queued until uvicorn
    serves them): a caller that started the server on port 0 can read the port and connect.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen()
    except OSError as exc:
        sock.close()
        raise ServerStartError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick "
                               "another --port or --host") from exc
    return sock
