"""Held client connections, as the availability tests of both servers use them."""

from __future__ import annotations

import socket


def closed_by_server(conns: list[socket.socket]) -> int:
    """How many of `conns` (non-blocking) the server has closed (EOF or reset)."""
    closed = 0
    for conn in conns:
        try:
            if conn.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    return closed
