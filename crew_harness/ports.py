"""A TCP port free on loopback, for a process that binds it a moment later.

The port is free when this returns, not reserved: another process could take it
in between. Callers that can pass a bound socket (`crew_common.tcp_listener`)
should; this is for starting a child process that takes `--port N`.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
