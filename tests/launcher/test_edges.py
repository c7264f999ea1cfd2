"""The escapes of issue 20 at the sandbox's edges, as permanent tests (items 2, 3, 6).

Same set-up as `test_escapes`: the launcher's own bwrap argv in both Linux
modes, as the caller (root in CI) and as an unprivileged user the tests
make. Each attack runs unsandboxed first where that is harmless: the
control proves the probe itself can see the escape.

- item 2: a host Unix datagram socket (a stand-in for journald's
  `/run/systemd/journal/socket`, made by the test in /var/tmp) reached
  through a `socketpair(AF_UNIX, SOCK_DGRAM)` end (sendto, or connect again).
- item 3: an overlay of `$HOME`, an overlay of its parent and a FUSE mount
  (bindfs) of `$HOME`, made by the test (as root) in /var/tmp: `~/.ssh/id_rsa`
  and another agent's token must not be readable through them; a FUSE mount
  of unknown origin (an sshfs-like source) is named in the launcher's /health.
- item 6b: `$HOME` (and with it the crew home) below the host's /tmp, as in
  the demo and the tests: the private /tmp must be readable back, and the
  secrets of `$HOME` must stay unreadable.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox_launcher.bwrap import LinuxMode
from tests.launcher.helpers import LauncherProcess, make_layout, write_fake_opencode
from tests.launcher.test_escapes import Sandbox, make_sandbox, sandbox  # noqa: F401 (fixture)
from tests.support.ci import required_in_ci

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


READ_PROBE = r"""
import json, sys

cfg = json.loads(sys.argv[1])
for name, path in cfg["reads"].items():
    try:
        with open(path) as f:
            print(json.dumps({"check": name, "worked": True, "result": f.read()}), flush=True)
    except OSError as exc:
        print(json.dumps({"check": name, "worked": False, "errno": exc.errno}), flush=True)
"""
SSH_KEY = "-----BEGIN OPENSSH PRIVATE KEY----- (the user's)\n"
OTHER_TOKEN = "token-of-bob\n"


class LayeredAliases:
    """Mounts of `$HOME` on devices of their own: two overlays and a bindfs (FUSE)."""

    def __init__(self, box: Sandbox) -> None:
        if os.getuid() != 0:
            required_in_ci("root (to mount overlays and FUSE file systems)")
        if shutil.which("bindfs") is None:
            required_in_ci("bindfs (Debian package bindfs; scripts/setup installs it)")
        home = box.home
        ssh = home / ".ssh"
        ssh.mkdir()
        (ssh / "id_rsa").write_text(SSH_KEY)
        bob = box.policy.crew_home / "runtime" / "r1" / "agents" / "bob"
        bob.mkdir(parents=True)
        (bob / "token").write_text(OTHER_TOKEN)
        for path in [ssh, ssh / "id_rsa", *(p for p in bob.parents if home in p.parents), bob]:
            os.lchown(path, box.uid, box.uid)
        os.lchown(bob / "token", box.uid, box.uid)
        self.base = Path(tempfile.mkdtemp(prefix="crew-layered-", dir="/var/tmp"))
        self.base.chmod(0o755)
        self.mounted: list[Path] = []
        rel_key = Path(".ssh/id_rsa")
        rel_token = bob.relative_to(home) / "token"
        self.reads = {"read_key_real": str(home / rel_key), "read_token_real": str(bob / "token")}
        for name, lower, below in (
            ("overlay_home", home, Path()),
            ("overlay_parent", home.parent, Path(home.name)),
        ):
            point = self._dir(name)
            upper, work = self._dir(f"{name}-upper"), self._dir(f"{name}-work")
            options = f"lowerdir={lower},upperdir={upper},workdir={work}"
            self._mount(["mount", "-t", "overlay", "overlay", "-o", options, str(point)], point)
            self.reads[f"read_key_{name}"] = str(point / below / rel_key)
            self.reads[f"read_token_{name}"] = str(point / below / rel_token)
        point = self._dir("bindfs_home")
        self._mount(["bindfs", "-o", "allow_other", str(home), str(point)], point)
        self.reads["read_key_bindfs"] = str(point / rel_key)
        self.reads["read_token_bindfs"] = str(point / rel_token)

    def _dir(self, name: str) -> Path:
        path = self.base / name
        path.mkdir(mode=0o755)
        return path

    def _mount(self, argv: list[str], point: Path) -> None:
        subprocess.run(argv, check=True, capture_output=True)
        self.mounted.append(point)

    def close(self) -> None:
        for point in reversed(self.mounted):
            subprocess.run(["umount", str(point)], check=False, capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def layered(sandbox: Sandbox) -> Iterator[LayeredAliases]:  # noqa: F811 (the fixture)
    found = LayeredAliases(sandbox)
    try:
        yield found
    finally:
        found.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(LinuxMode))
def test_overlay_and_fuse_mounts_of_home_are_masked(
    mode: LinuxMode,
    sandbox: Sandbox,  # noqa: F811 (the fixture)
    layered: LayeredAliases,
) -> None:
    cfg = {"reads": layered.reads}
    control = _probe(sandbox, READ_PROBE, None, cfg)
    for name in layered.reads:
        assert control[name]["worked"], f"control: {name} must work unsandboxed: {control[name]}"
        assert control[name]["result"] in (SSH_KEY, OTHER_TOKEN)

    results = _probe(sandbox, READ_PROBE, mode, cfg)

    for name in layered.reads:
        r = results[name]
        assert not r["worked"], f"{name} was NOT denied: {r}"
        assert r["errno"] in (errno.EACCES, errno.ENOENT), (name, r)


MS_NOSUID, MS_NODEV = 2, 4


@pytest.fixture
def unknown_fuse_mount() -> Iterator[Path]:
    """A FUSE mount whose source names no local path (as sshfs's `me@nas:/home`).

    Mounted straight on a /dev/fuse descriptor that is then closed: the mount
    stays listed in mountinfo, and every access to it fails (ENOTCONN) at once.
    """
    if os.getuid() != 0:
        required_in_ci("root (to mount a FUSE file system)")
    point = Path(tempfile.mkdtemp(prefix="crew-nas-", dir="/var/tmp"))
    fd = os.open("/dev/fuse", os.O_RDWR)
    libc = ctypes.CDLL(None, use_errno=True)
    data = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
    rc = libc.mount(b"me@nas:/home", str(point).encode(), b"fuse.sshfs", MS_NOSUID | MS_NODEV, data)
    os.close(fd)
    if rc != 0:
        point.rmdir()
        pytest.fail(f"mounting a FUSE file system failed: {os.strerror(ctypes.get_errno())}")
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=False, capture_output=True)
        point.rmdir()


@pytest.mark.timeout(120)
def test_a_mount_that_cannot_be_judged_is_named_in_the_health(
    needs_bwrap: None, isolated_home: Path, tmp_path: Path, unknown_fuse_mount: Path
) -> None:
    layout = make_layout(isolated_home)
    launcher = LauncherProcess(layout, write_fake_opencode(tmp_path / "engine-bin"), mode="tmpfs")
    try:
        with launcher.client() as client:
            sandbox_health = client.get("/health").json()["sandbox"]
    finally:
        launcher.stop()
    assert sandbox_health["ok"], sandbox_health
    named = [n for n in sandbox_health["not_granted"] if str(unknown_fuse_mount) in n]
    assert len(named) == 1, sandbox_health["not_granted"]
    assert "fuse.sshfs mount of me@nas:/home whose origin cannot be judged" in named[0]
