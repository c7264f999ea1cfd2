"""The escapes of issue 20 at the sandbox's edges, as permanent tests (items 2, 3, 6).

Same set-up as `test_escapes`: the launcher's own bwrap argv in both Linux
modes, as the caller (root in CI) and as an unprivileged user the tests
make. Each attack runs unsandboxed first where that is harmless: the
control proves the probe itself can see the escape.

- item 2: a host Unix datagram socket (a stand-in for journald's
  `/run/systemd/journal/socket`, made by the test in /var/tmp) reached
  through a `socketpair(AF_UNIX, SOCK_DGRAM)` end (sendto, or connect again).
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_launcher.bwrap import LinuxMode
from tests.launcher.test_escapes import Sandbox, sandbox  # noqa: F401 (the fixture)

DGRAM_PROBE = r"""
import json, socket, sys

cfg = json.loads(sys.argv[1])
target = cfg["dgram"]


def emit(name, worked, **more):
    print(json.dumps({"check": name, "worked": worked, **more}), flush=True)


def attempt(name, action):
    try:
        result = action()
    except OSError as exc:
        emit(name, False, errno=exc.errno, error=str(exc))
        return
    emit(name, True, result=repr(result)[:300])


def pair_sendto(kind):
    a, b = socket.socketpair(socket.AF_UNIX, kind)
    with a, b:
        return a.sendto(f"sendto {kind}".encode(), target)


def pair_connect(kind):
    a, b = socket.socketpair(socket.AF_UNIX, kind)
    with a, b:
        b.connect(target)
        return b.send(f"connect {kind}".encode())


def pair_roundtrip(kind):
    a, b = socket.socketpair(socket.AF_UNIX, kind)
    with a, b:
        a.send(b"ping")
        return b.recv(8).decode()


DGRAM, RAW = socket.SOCK_DGRAM, 3  # SOCK_RAW is a datagram socket for AF_UNIX
attempt("dgram_sendto", lambda: pair_sendto(DGRAM))
attempt("dgram_cloexec_sendto", lambda: pair_sendto(DGRAM | socket.SOCK_CLOEXEC))
attempt("dgram_nonblock_sendto", lambda: pair_sendto(DGRAM | socket.SOCK_NONBLOCK))
attempt("dgram_connect", lambda: pair_connect(DGRAM))
attempt("raw_sendto", lambda: pair_sendto(RAW))
# positive controls: what tools need (Bun, Node, Python subprocesses)
attempt("stream_pair", lambda: pair_roundtrip(socket.SOCK_STREAM))
attempt("stream_cloexec_pair", lambda: pair_roundtrip(socket.SOCK_STREAM | socket.SOCK_CLOEXEC))
attempt("seqpacket_pair", lambda: pair_roundtrip(socket.SOCK_SEQPACKET))
# … and a seqpacket end cannot be pointed at the host's socket either
attempt("seqpacket_sendto", lambda: pair_sendto(socket.SOCK_SEQPACKET))
attempt("seqpacket_connect", lambda: pair_connect(socket.SOCK_SEQPACKET))
"""
DGRAM_ATTACKS = (
    "dgram_sendto",
    "dgram_cloexec_sendto",
    "dgram_nonblock_sendto",
    "dgram_connect",
    "raw_sendto",
)


class DatagramListener:
    """A bound Unix datagram socket of the host, writable by everyone (as journald's is)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="crew-dgram-", dir="/var/tmp"))
        self.dir.chmod(0o755)
        self.path = self.dir / f"journal-{uuid.uuid4().hex[:8]}.socket"
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(str(self.path))
        os.chmod(self.path, 0o777)  # only the sandbox may stand between it and the probe
        self.socket.setblocking(False)

    def received(self) -> list[bytes]:
        got = []
        while True:
            try:
                got.append(self.socket.recv(256))
            except BlockingIOError:
                return got

    def close(self) -> None:
        self.socket.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def dgram_listener() -> Iterator[DatagramListener]:
    listener = DatagramListener()
    try:
        yield listener
    finally:
        listener.close()


def _probe(box: Sandbox, script: str, mode: LinuxMode | None, cfg: dict[str, Any]) -> Any:
    (box.policy.agent_dir / "probe.py").write_text(script)
    return box.probe(mode, cfg)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(LinuxMode))
def test_host_datagram_sockets_are_not_reachable_through_a_socketpair(
    mode: LinuxMode,
    sandbox: Sandbox,  # noqa: F811 (the fixture)
    dgram_listener: DatagramListener,
) -> None:
    cfg = {"dgram": str(dgram_listener.path)}
    control = _probe(sandbox, DGRAM_PROBE, None, cfg)
    for name in DGRAM_ATTACKS:
        assert control[name]["worked"], f"control: {name} must work unsandboxed: {control[name]}"
    assert len(dgram_listener.received()) == len(DGRAM_ATTACKS)

    results = _probe(sandbox, DGRAM_PROBE, mode, cfg)

    for name in DGRAM_ATTACKS:
        r = results[name]
        assert not r["worked"] and r["errno"] == errno.EPERM, f"{name} was NOT denied: {r}"
    # A seqpacket end stays connected to its peer: connect() fails (EISCONN; EPROTOTYPE
    # for a datagram target), and sendto() ignores the address (it reaches the peer).
    connect = results["seqpacket_connect"]
    assert connect.get("errno") in (errno.EISCONN, errno.EPROTOTYPE), connect
    assert dgram_listener.received() == []
    for name in ("stream_pair", "stream_cloexec_pair", "seqpacket_pair"):
        assert results[name]["worked"] and results[name]["result"] == "'ping'", results[name]
