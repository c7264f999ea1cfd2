"""The escapes of issue 20 at the sandbox's edges, as permanent tests (items 2, 3, 6).

Same set-up as `test_escapes`: the launcher's own bwrap argv in both Linux
modes, as the caller (root in CI) and as an unprivileged user the tests
make. Each attack runs unsandboxed first where that is harmless: the
control proves the probe itself can see the escape.

- item 2: a host Unix datagram socket (a stand-in for journald's
  `/run/systemd/journal/socket`, made by the test in /var/tmp) reached
  through a `socketpair(AF_UNIX, SOCK_DGRAM)` end (sendto, or connect again).
- item 6b: `$HOME` (and with it the crew home) below the host's /tmp, as in
  the demo and the tests: the private /tmp must be readable back, and the
  secrets of `$HOME` must stay unreadable.
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
from tests.launcher.test_escapes import Sandbox, make_sandbox, sandbox  # noqa: F401 (fixture)

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


TMP_PROBE = r"""
import json, os, subprocess, sys

cfg = json.loads(sys.argv[1])


def emit(name, worked, **more):
    print(json.dumps({"check": name, "worked": worked, **more}), flush=True)


def attempt(name, action):
    try:
        result = action()
    except OSError as exc:
        emit(name, False, errno=exc.errno, error=str(exc))
        return
    emit(name, True, result=repr(result)[:300])


def write_read(path):
    with open(path, "w") as f:
        f.write("tmp-ok")
    with open(path) as f:
        return f.read()


def shell(command):
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(0, f"exit {done.returncode}: {done.stderr.strip()[:200]}")
    return done.stdout.strip()


attempt("tmp_write_read", lambda: write_read("/tmp/a"))
attempt("tmp_mkdir_read", lambda: (os.makedirs("/tmp/d/e"), write_read("/tmp/d/e/f"))[1])
attempt("tmp_shell", lambda: shell("echo shell-ok > /tmp/b && cat /tmp/b"))
attempt("tmpdir_write_read", lambda: write_read(os.path.join(os.environ["TMPDIR"], "c")))
attempt("work_write_read", lambda: write_read(os.path.join(cfg["work"], "w")))
for name, path in cfg["secrets"].items():
    attempt(name, lambda: open(path).read())
"""


@pytest.fixture(params=["caller", "unprivileged"])
def tmp_sandbox(request: pytest.FixtureRequest, needs_bwrap: None) -> Iterator[Sandbox]:
    """A sandbox whose $HOME and crew home lie below the host's /tmp."""
    yield from make_sandbox(request.param, "/tmp")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(LinuxMode))
def test_the_private_tmp_is_readable_back_when_home_is_below_tmp(
    mode: LinuxMode, tmp_sandbox: Sandbox
) -> None:
    box = tmp_sandbox
    p = box.policy
    assert str(p.home).startswith("/tmp/") and str(p.tmp_dir).startswith("/tmp/")
    secrets = {"read_ssh_key": box.home / ".ssh" / "id_rsa", "read_crew": p.crew_home / "token"}
    secrets["read_other_tmp"] = box.home.parent / "host-tmp-file"  # the host's /tmp
    for path in secrets.values():
        path.parent.mkdir(exist_ok=True)
        path.write_text("secret\n")
        path.chmod(0o644)  # only the sandbox may stand between it and the probe
    cfg = {"work": str(p.work_dir), "secrets": {k: str(v) for k, v in secrets.items()}}

    results = _probe(box, TMP_PROBE, mode, cfg)

    assert results["tmp_write_read"].get("result") == "'tmp-ok'", results["tmp_write_read"]
    assert results["tmp_mkdir_read"].get("result") == "'tmp-ok'", results["tmp_mkdir_read"]
    assert results["tmp_shell"].get("result") == "'shell-ok'", results["tmp_shell"]
    assert results["tmpdir_write_read"].get("result") == "'tmp-ok'", results["tmpdir_write_read"]
    assert results["work_write_read"].get("result") == "'tmp-ok'", results["work_write_read"]
    # what the sandbox wrote in its /tmp is the agent's own temp dir on the host
    assert (p.tmp_dir / "a").read_text() == "tmp-ok"
    for name in secrets:
        r = results[name]
        assert not r["worked"] and r["errno"] in (errno.EACCES, errno.ENOENT), (name, r)
