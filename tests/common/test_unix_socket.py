"""The private socket of both services: 0600 in a 0700 dir, other users cut off before any HTTP."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from crew_common.unix_socket import (
    SocketInUse,
    UnsafeSocketPath,
    bind_private_socket,
    peer_checked_h11,
    peer_uid,
)
from crew_harness.waiting import wait_until_async
from tests.support.ci import required_in_ci

RAW_GET = (
    "import socket,sys\n"
    "s=socket.socket(socket.AF_UNIX)\n"
    "s.connect(sys.argv[1])\n"
    "sys.stdout.write('connected\\n')\n"
    "s.sendall(b'GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
    "data=b''\n"
    "while True:\n"
    "    c=s.recv(4096)\n"
    "    if not c or b'hello' in data+c: data+=c; break\n"
    "    data+=c\n"
    "sys.stdout.write(data.decode())\n"
)


async def hello(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


@pytest.fixture
def open_dir() -> Iterator[Path]:
    # Reachable by other users on purpose: here only the peer check stands guard.
    path = Path(tempfile.mkdtemp(prefix="crew-peer-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _get(path: Path, user: int | None = None) -> str:
    done = subprocess.run(
        ["/usr/bin/python3" if user is not None else sys.executable, "-c", RAW_GET, str(path)],
        capture_output=True,
        text=True,
        timeout=20,
        user=user,
        check=False,
    )
    return done.stdout


async def _serve_and_get(sock_path: Path, allowed_uid: int, user: int | None) -> str:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(sock_path))
    sock_path.chmod(0o666)
    sock.listen(8)
    config = uvicorn.Config(
        hello, http=peer_checked_h11(allowed_uid), lifespan="off", log_config=None
    )
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        await wait_until_async("the server to start", lambda: server.started)
        answer = await anyio.to_thread.run_sync(_get, sock_path, user)
        server.should_exit = True
    return answer


def test_peer_uid_of_a_socketpair_is_ours() -> None:
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        assert peer_uid(a) == os.getuid()


@pytest.mark.anyio
async def test_same_user_is_served_other_uid_is_cut_off(open_dir: Path) -> None:
    served = await _serve_and_get(open_dir / "a.sock", os.getuid(), None)
    assert served.startswith("connected\nHTTP/1.1 200") and "hello" in served
    refused = await _serve_and_get(open_dir / "b.sock", os.getuid() + 4242, None)
    assert refused == "connected\n"  # the socket was reached, then closed without a byte


@pytest.mark.anyio
async def test_a_real_other_user_is_cut_off(open_dir: Path) -> None:
    if os.getuid() != 0 or not os.path.exists("/usr/bin/python3"):
        required_in_ci("root and /usr/bin/python3 (to act as another user)")
    refused = await _serve_and_get(open_dir / "c.sock", 0, 65534)
    assert refused == "connected\n"  # the socket was reached, then closed without a byte


def test_socket_is_private_and_refuses_a_second_server(tmp_path: Path) -> None:
    path = tmp_path / "crew" / "sockets" / "computer.sock"
    sock = bind_private_socket(path)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
        with pytest.raises(SocketInUse):
            bind_private_socket(path)
    finally:
        sock.close()
    # A leftover socket of a process that died is replaced.
    again = bind_private_socket(path)
    again.close()


def test_an_existing_directory_is_made_private(tmp_path: Path) -> None:
    (tmp_path / "sockets").mkdir(mode=0o755)
    bind_private_socket(tmp_path / "sockets" / "s.sock").close()
    assert stat.S_IMODE(os.stat(tmp_path / "sockets").st_mode) == 0o700


def test_socket_directory_must_not_be_a_symlink(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    home = tmp_path / "crew"
    home.mkdir()
    (home / "sockets").symlink_to(elsewhere)
    with pytest.raises(UnsafeSocketPath, match="not a directory owned by this user"):
        bind_private_socket(home / "sockets" / "computer.sock")


def test_a_file_in_the_sockets_place_is_never_replaced(tmp_path: Path) -> None:
    path = tmp_path / "sockets" / "launcher.sock"
    path.parent.mkdir()
    path.write_text("not a socket")
    with pytest.raises(UnsafeSocketPath, match="not a socket"):
        bind_private_socket(path)
    assert path.read_text() == "not a socket"
