"""crew-server stays answerable (issue 20, item 14): idle connections beyond its descriptor
limit, a slowloris, and more connections than its cap — the real process on loopback.

Each test holds what a hostile client holds while it checks `/health`, so each fails
on a server without the limits (crew_common/connection_limits.py): there `/health`
never answered while 300 idle connections were held under `ulimit -n 128`, and a
header sent byte by byte kept its connection for ever.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from crew_harness.waiting import wait_until
from crew_testkit.crew_server_proc import computer_connection, start_crew_server
from tests.support.sockets import closed_by_server

pytestmark = pytest.mark.timeout(120)


@contextmanager
def idle_connections(url: str, count: int) -> Iterator[list[socket.socket]]:
    """`count` TCP connections to the server at `url` that send nothing."""
    parts = urlsplit(url)
    conns: list[socket.socket] = []
    try:
        for _ in range(count):
            conn = socket.create_connection((parts.hostname, parts.port), timeout=10)
            conn.setblocking(False)
            conns.append(conn)
        yield conns
    finally:
        for conn in conns:
            conn.close()


def health_answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def accept_errors(log: str) -> list[str]:
    """The lines of `log` about failed accepts (asyncio's, with their tracebacks, or ours)."""
    return [
        line
        for line in log.splitlines()
        if "accept" in line.lower() or "Traceback" in line or "Too many open files" in line
    ]


def test_health_answers_while_more_idle_connections_are_held_than_descriptors(
    tmp_path: Path,
) -> None:
    # A long header timeout: /health must get in by closing idle connections, not by waiting.
    with start_crew_server(
        tmp_path, args=["--header-timeout", "600"], open_file_limit=128
    ) as server:
        with idle_connections(server.url, 300) as conns:
            wait_until("/health answers", lambda: health_answers(server.url), 60)
            # The idle ones went to make room (the process can hold fewer than 128).
            assert closed_by_server(conns) > 300 - 128
            # The user's work goes on meanwhile.
            computer = server.create_computer("still-works")
            assert computer["token"]
        log = server.output()
    errors = accept_errors(log)
    # Ours: the first failure, then a count at most once a minute (and once at stop).
    assert len(errors) <= 3, log[-3000:]
    assert "socket.accept() out of system resource" not in log


def test_a_header_sent_byte_by_byte_is_dropped_after_the_header_timeout(tmp_path: Path) -> None:
    with start_crew_server(tmp_path, args=["--header-timeout", "2"]) as server:
        parts = urlsplit(server.url)
        head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: y\r\n" * 1000
        sent = 0
        with socket.create_connection((parts.hostname, parts.port), timeout=10) as slow:
            slow.setblocking(False)

            def dropped() -> bool:
                # Each look sends one more byte of a head that never ends, as a slowloris does.
                nonlocal sent
                try:
                    slow.send(head[sent : sent + 1])
                    sent += 1
                except OSError:
                    return True
                return closed_by_server([slow]) == 1

            wait_until("the slow connection dropped", dropped, 60)
        # Dropped by the timeout, not by h11's 16 KiB limit on a request head.
        assert sent < 2_000
        # Positive control: a client that sends its request answers, twice on one connection.
        with httpx.Client(base_url=server.url, timeout=10) as client:
            assert client.get("/health").status_code == 200
            assert client.get("/health").status_code == 200


def test_beyond_the_cap_the_idlest_goes_and_an_open_event_stream_stays(tmp_path: Path) -> None:
    with start_crew_server(
        tmp_path, args=["--max-connections", "8", "--header-timeout", "600"]
    ) as server:
        computer = server.create_computer("streamer")
        headers = computer_connection(server.client(), computer["token"])
        with (
            httpx.Client(base_url=server.url, timeout=30) as computer_client,
            computer_client.stream("GET", "/computer/events", headers=headers) as stream,
        ):
            assert stream.status_code == 200
            lines = stream.iter_lines()
            assert next(lines) == ": connected"
            with idle_connections(server.url, 20) as conns:
                # 1 stream + 7 idle fit; each later idle connection closed the idlest.
                wait_until("13 idle connections closed", lambda: closed_by_server(conns) >= 13)
                assert closed_by_server(conns) == 13
                wait_until("/health answers", lambda: health_answers(server.url), 60)
                # The stream was in a request: it stayed, and still gets its events.
                agent = server.create_agent("sam", computer_id=computer["computer_id"])
                wanted = f'data: {{"agent_id":"{agent["id"]}"}}'
                assert wanted in _until_line(lines, wanted)


def _until_line(lines: Iterator[str], wanted: str) -> list[str]:
    seen = []
    for line in lines:
        seen.append(line)
        if line == wanted:
            break
    return seen
