"""`scripts/bench nodelay`: answer latency on a reused connection, with and without TCP_NODELAY.

crew-server's uvicorn set-up (`crew_server.__main__.http_server`) on two loopback
listeners in this process: crew-server's own (`listening_socket`: IPPROTO_TCP,
so every accepted connection gets TCP_NODELAY) and one made as the listener was
before issue 20 (`socket.socket(AF_INET, SOCK_STREAM)`, protocol 0: asyncio
leaves Nagle's algorithm on). One keep-alive client each, requests alternating
between the two, as the Computer's long-lived client makes them: `GET /health`
and an authenticated `GET /api/agents`. Printed: the median and p90 of each and
the ratio without/with.

Usage: scripts/bench nodelay [--requests N]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crew_common.connection_limits import ConnectionLimits
from crew_server.__main__ import http_server, listening_socket, served_url
from crew_server.app import create_app
from crew_server.clock import Clock
from crew_server.store import Store


def old_listener() -> socket.socket:
    """The listener as crew-server made it before: protocol 0, so no TCP_NODELAY."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def serve(store: Store, listener: socket.socket) -> tuple[str, Any, Any, threading.Thread]:
    url = served_url(listener)
    server, sock = http_server(create_app(store, Clock()), listener, ConnectionLimits(), "warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    return url, server, sock, thread


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench nodelay")
    parser.add_argument("--requests", type=int, default=200, help="per path and listener")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(str(Path(tmp) / "crew.db"), Clock())
        token = store.ensure_user_token()
        headers = {"Authorization": f"Bearer {token}"}
        servers = {"with": serve(store, listening_socket("127.0.0.1", 0))}
        servers["without"] = serve(store, old_listener())
        times: dict[tuple[str, str], list[float]] = {}
        clients = {
            name: httpx.Client(base_url=s[0], headers=headers) for name, s in servers.items()
        }
        try:
            for path in ("/health", "/api/agents"):
                for client in clients.values():
                    client.get(path).raise_for_status()  # the connection is open and reused
                for _ in range(args.requests):
                    for name, client in clients.items():
                        start = time.perf_counter()
                        client.get(path).raise_for_status()
                        times.setdefault((name, path), []).append(time.perf_counter() - start)
        finally:
            for client in clients.values():
                client.close()
            for _url, server, sock, thread in servers.values():
                server.should_exit = True
                thread.join(timeout=20)
                sock.close()
            store.close()
    print(f"answer latency on a reused loopback connection, {args.requests} requests each")
    print(f"  {'request':<16}{'TCP_NODELAY':>13}{'median':>11}{'p90':>11}")
    for path in ("/health", "/api/agents"):
        for name in ("without", "with"):
            t = times[(name, path)]
            print(
                f"  GET {path:<12}{name:>13}{statistics.median(t) * 1000:>9.2f} ms"
                f"{percentile(t, 0.9) * 1000:>8.2f} ms"
            )
        ratio = statistics.median(times[("without", path)]) / statistics.median(
            times[("with", path)]
        )
        print(f"  GET {path:<12}{'ratio':>13}{ratio:>9.1f} x  (median without / with)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
