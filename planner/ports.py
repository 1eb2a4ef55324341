"""Finding TCP ports for the servers the planner starts."""

from __future__ import annotations

import socket


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # What uvicorn does too, so a port whose last connections sit in TIME_WAIT counts as free.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now. Another process may take it before the server binds it;
    the launcher then sees the server exit and reports its log."""
    with _bind(host, 0) as sock:
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    try:
        _bind(host, port).close()
    except OSError:
        return False
    return True
