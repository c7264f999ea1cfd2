"""Every TCP listener we serve on hands out connections with TCP_NODELAY (issue 20, item 13).

Checked on the server's side of each accepted connection (getsockopt), not by
timing: without it each answer on a reused connection waited ~40 ms for the
client's delayed ACK (`scripts/bench nodelay` measures that side by side).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from crew_common.connection_limits import ConnectionLimits
from crew_common.tcp_listener import nodelay
from crew_harness.scripted_model import ScriptedModel, scenario
from crew_harness.waiting import wait_until
from crew_server.__main__ import http_server, listening_socket, served_url
from crew_server.app import create_app
from crew_server.clock import Clock
from crew_server.store import Store

pytestmark = pytest.mark.timeout(60)


def accepted_nodelay(connections: Any) -> list[bool]:
    """TCP_NODELAY of each connection the server holds (its own end of it)."""
    return [nodelay(conn.transport.get_extra_info("socket")) for conn in connections]


@contextmanager
def crew_server_in_a_thread(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """crew-server's own listener and uvicorn set-up (`http_server`), served from a thread."""
    store = Store(str(tmp_path / "crew.db"), Clock())
    listener = listening_socket("127.0.0.1", 0)
    url = served_url(listener)
    app = create_app(store, Clock())
    server, sock = http_server(app, listener, ConnectionLimits(), "warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until("crew-server started", lambda: server.started)
        yield url, server
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()
        store.close()


def test_crew_server_connections_have_tcp_nodelay(tmp_path: Path) -> None:
    with crew_server_in_a_thread(tmp_path) as (url, server), httpx.Client(base_url=url) as client:
        # Two answers on one reused connection, as the Computer's client makes them.
        assert client.get("/health").status_code == 200
        assert client.get("/health").status_code == 200
        held = server.server_state.connections
        wait_until("the connection is held", lambda: len(held) == 1)
        assert accepted_nodelay(held) == [True]


def test_the_scripted_model_connections_have_tcp_nodelay() -> None:
    with ScriptedModel(scenario("ok")) as model, httpx.Client(base_url=model.url) as client:
        client.get("/v1/models")
        held = model._server.server_state.connections  # type: ignore[union-attr]
        wait_until("the connection is held", lambda: len(held) == 1)
        assert accepted_nodelay(held) == [True]
