"""The TCP listening sockets our HTTP servers serve on: bound like uvicorn binds, with TCP_NODELAY.

asyncio turns Nagle's algorithm off on a connection only when its socket says
`IPPROTO_TCP` (`base_events._set_nodelay`), and an accepted socket inherits the
listener's protocol number. A listener made as `socket.socket(AF_INET, SOCK_STREAM)`
has protocol 0, so every response written in two parts (uvicorn writes the head,
then the body) waited for the client's delayed ACK: ~40 ms per request on a
reused connection. Listeners made here carry `IPPROTO_TCP` (and set
TCP_NODELAY on the listener, which Linux copies to each accepted socket).
"""

from __future__ import annotations

import socket


def tcp_listener(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (not yet listening); `OSError` when the address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        listener.bind((host, port))
    except OSError:
        listener.close()
        raise
    return listener


def nodelay(sock: socket.socket) -> bool:
    """Whether Nagle's algorithm is off on `sock` (a connected TCP socket)."""
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
