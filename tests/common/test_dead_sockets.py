"""Sockets left by launchers that are gone are removed; live ones and anything else stay."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from crew_common.unix_socket import remove_dead_sockets


@pytest.fixture
def sockets() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="crew-socks-", dir="/tmp"))  # short: AF_UNIX paths
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def dead_socket(path: Path) -> None:
    """What a killed process leaves: a bound socket file nobody listens on."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))
        sock.listen()


def test_only_dead_launcher_sockets_go(sockets: Path) -> None:
    dead_socket(sockets / "launcher-aaaa.sock")
    dead_socket(sockets / "launcher-bbbb-2.sock")
    dead_socket(sockets / "computer.sock")  # not a launcher's: another pattern
    (sockets / "launcher-file.sock").write_text("not a socket")
    (sockets / "launcher-link.sock").symlink_to(sockets / "launcher-aaaa.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(sockets / "launcher-live.sock"))
        live.listen()
        removed = remove_dead_sockets(sockets, "launcher-*.sock")
    assert removed == ["launcher-aaaa.sock", "launcher-bbbb-2.sock"]
    left = sorted(p.name for p in sockets.iterdir())
    assert left == [
        "computer.sock",
        "launcher-file.sock",
        "launcher-link.sock",
        "launcher-live.sock",
    ]


def test_a_missing_directory_has_nothing_to_remove(sockets: Path) -> None:
    assert remove_dead_sockets(sockets / "absent", "launcher-*.sock") == []
