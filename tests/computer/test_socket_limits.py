"""The introspection socket cannot be exhausted: a connection cap, header/idle timeouts, and
accept errors (EMFILE) logged once, then a count — the real server on a real socket."""

from __future__ import annotations

import os
import re
import resource
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from computer_service.event_bus import EventBus
from computer_service.introspection import INTROSPECTION_LIMITS, IntrospectionServer, create_app
from crew_common.connection_limits import ConnectionLimits, raise_open_file_limit
from crew_harness.waiting import wait_until, wait_until_async
from crew_testkit.computer_proc import machine
from tests.computer.static_view import StaticView
from tests.support.sockets import closed_by_server

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def idle_connections(path: Path, count: int) -> Iterator[list[socket.socket]]:
    """`count` connections to `path` that send nothing."""
    conns: list[socket.socket] = []
    try:
        for _ in range(count):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(str(path))
            conn.setblocking(False)
            conns.append(conn)
        yield conns
    finally:
        for conn in conns:
            conn.close()


@pytest.mark.anyio
async def test_idle_connections_hit_the_cap_then_time_out_and_health_answers(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sockets" / "computer.sock"
    limits = ConnectionLimits(max_connections=8, header_timeout_s=2.0)
    server = IntrospectionServer(create_app(StaticView(), EventBus()), path, limits=limits)
    await server.start()
    try:
        with idle_connections(path, 30) as conns:
            # Beyond the cap each one is closed at once; the cap holds meanwhile.
            await wait_until_async("22 closed", lambda: closed_by_server(conns) >= 22, 30)
            assert server.open_connections <= 8
            # A slow client sends part of a request head and stops: it times out too.
            with idle_connections(path, 1) as [slow]:
                slow.send(b"GET /health HTTP/1.1\r\nHo")
                await wait_until_async(
                    "all closed", lambda: closed_by_server([*conns, slow]) == 31, 60
                )
        assert server.open_connections == 0
        transport = httpx.AsyncHTTPTransport(uds=str(path))
        async with httpx.AsyncClient(transport=transport, base_url="http://computer") as client:
            assert (await client.get("/health")).status_code == 200
            # A keep-alive connection that answered one request is closed once idle too.
            await wait_until_async(
                "the idle keep-alive closed", lambda: server.open_connections == 0
            )
    finally:
        await server.stop()


def test_the_computer_uses_bounded_limits() -> None:
    assert 8 <= INTROSPECTION_LIMITS.max_connections <= 1024
    assert 1 <= INTROSPECTION_LIMITS.header_timeout_s <= 60


EMFILE_SERVER = """
import logging, resource, sys
from pathlib import Path
import anyio
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
from computer_service.event_bus import EventBus
from computer_service.introspection import IntrospectionServer, create_app
from crew_common.connection_limits import ConnectionLimits
from tests.computer.static_view import StaticView

limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

async def main() -> None:
    cap = int(sys.argv[3]) if len(sys.argv) > 3 else 10_000
    limits = ConnectionLimits(max_connections=cap, header_timeout_s=600)
    server = IntrospectionServer(create_app(StaticView(), EventBus()), Path(sys.argv[1]), limits=limits)
    await server.start()
    sys.stdout.write("serving\\n")
    sys.stdout.flush()
    await anyio.wait_readable(sys.stdin.fileno())  # until the test closes stdin
    await server.stop()

anyio.run(main)
"""


def test_out_of_file_descriptors_is_logged_once_and_connections_are_shed() -> None:
    with machine() as m:
        path = m.root / "s" / "computer.sock"
        child = subprocess.Popen(
            [sys.executable, "-c", EMFILE_SERVER, str(path), "64"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=m.env() | {"PYTHONPATH": str(ROOT)},
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == b"serving\n"
            # 64 descriptors: the idle connections use up the rest, the later ones are shed.
            with idle_connections(path, 120) as conns:
                wait_until("connections shed", lambda: closed_by_server(conns) >= 40)
            assert child.stdin is not None
            child.stdin.close()
            assert child.wait(timeout=60) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.stderr is not None
        log = child.stderr.read().decode()
    lines = [line for line in log.splitlines() if "out of file descriptors" in line]
    # The first failure, then one count (at stop) of every later one: one per shed connection.
    assert len(lines) == 2, log
    assert "Too many open files" in lines[0] and "logged once" in lines[0]
    counted = re.search(r": (\d+) more times \((\d+) in all\)$", lines[1])
    assert counted is not None, log
    assert 40 <= int(counted[2]) == int(counted[1]) + 1 <= 120, log
    assert "socket.accept() out of system resource" not in log  # asyncio's per-second line
    assert len(log.splitlines()) <= 4, log


def test_the_soft_open_file_limit_is_raised_to_the_hard_one() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import resource\n"
            "from crew_common.connection_limits import raise_open_file_limit\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))\n"
            "print(*raise_open_file_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))\n",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == ["4096", "4096", "4096", "4096"]
    assert raise_open_file_limit()[0] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert os.sysconf("SC_OPEN_MAX") > 0


def health_over(path: Path) -> bool:
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), timeout=2) as client:
            return client.get("http://computer/health").status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("cap", [64, 10_000])
def test_health_answers_while_idle_connections_hold_the_cap_or_every_descriptor(cap: int) -> None:
    # Issue 20: 64 idle connections (or all descriptors) kept /health out until they timed
    # out; a long header timeout here, so only closing the idlest lets /health in.
    with machine() as m:
        path = m.root / "s" / "computer.sock"
        child = subprocess.Popen(
            [sys.executable, "-c", EMFILE_SERVER, str(path), "128", str(cap)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=m.env() | {"PYTHONPATH": str(ROOT)},
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == b"serving\n"
            with idle_connections(path, 200) as conns:
                wait_until("/health answers", lambda: health_over(path), 60)
                assert closed_by_server(conns) > 200 - min(cap, 128)
            assert child.stdin is not None
            child.stdin.close()
            assert child.wait(timeout=60) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
