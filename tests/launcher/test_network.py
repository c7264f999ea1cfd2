"""Each sandbox's own network namespace (issue 12, escape 4): the attacks fail, the agent's work does not.

Through `crew-launcher sandbox` (the real backend, the self-test first, pasta
attached by `SandboxNetwork`) in both Linux modes, as the caller (root in
CI) and as an unprivileged user (one the tests make, running the system Python with
this checkout on its path). Sources of the cases: the red team's escape 4
(port squatting while the crew server restarts, listening on 0.0.0.0,
reading `/proc/net/tcp`, a host abstract socket like X11's
`@/tmp/.X11-unix/X0`), sandbox-runtime `integration.test.ts` ("network
isolation": loopback services of the host out of reach).

The control (`test_the_probe_sees_the_escapes_without_a_namespace`) runs
the same probe in the same sandbox minus its network namespace: every
attack then works, so the probe can see them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from crew_harness.ports import free_port
from crew_harness.waiting import wait_until
from sandbox_launcher.backend import BwrapBackend, open_backend
from sandbox_launcher.bwrap import LinuxMode
from sandbox_launcher.network import NetworkPlan, SandboxNetwork, find_nftables, find_pasta
from sandbox_launcher.policy import SandboxPolicy
from tests.launcher.helpers import children_of
from tests.support.ci import required_in_ci
from tests.support.users import unprivileged_uid

SYSTEM_PYTHON = "/usr/bin/python3"
REPO = Path(__file__).resolve().parents[2]
SITE = Path(next(p for p in sys.path if p.endswith("site-packages")))

# Runs inside the sandbox (the system Python, standard library only). Prints one
# JSON line per check; "ready" once its listeners are up, then waits for stdin EOF
# (the host has tried to reach them) and reports whether anything came in.
PROBE = r"""
import json, socket, sys

cfg = json.loads(sys.argv[1])


def emit(name, worked, **more):
    print(json.dumps({"check": name, "worked": worked, **more}), flush=True)


def attempt(name, action):
    try:
        result = action()
    except OSError as exc:
        emit(name, False, error=str(exc))
        return None
    emit(name, True, result=repr(result)[:200])
    return result


def listen(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(8)
    s.setblocking(False)
    return s


def fetch(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        return c.recv(100).decode()


def fetch_from(host, port):
    with socket.create_connection((host, port), timeout=10) as c:
        return c.recv(100).decode()


def host_listeners():
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    return sorted({int(r[1].split(":")[1], 16) for r in rows if r[3] == "0A"})


def abstract():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with s:
        s.connect(cfg["abstract"])
    return "connected"


squat = attempt("squat_server_port", lambda: listen("127.0.0.1", cfg["server_port"]))
wide = attempt("listen_all_addresses", lambda: listen("0.0.0.0", cfg["wide_port"]))
seen = attempt("read_proc_net_tcp", host_listeners)
emit("host_listener_visible", bool(seen) and cfg["unforwarded"] in seen)
attempt("unforwarded_loopback", lambda: fetch(cfg["unforwarded"]))
attempt("abstract_socket", abstract)
attempt("forwarded_loopback", lambda: fetch(cfg["forwarded"]))
if cfg.get("outside"):
    attempt("host_own_address", lambda: fetch_from(*cfg["outside"]))
emit("ready", True)
sys.stdin.read()  # the host has tried our listeners
for name, s in (("squat_received", squat), ("wide_received", wide)):
    got = None
    if s is not None:
        try:
            conn, _ = s.accept()
            got = conn.recv(100).decode()
        except BlockingIOError:
            got = None
    emit(name, got is not None, data=got)
"""


def _host_address() -> str | None:
    """This machine's non-loopback IPv4 address (no packet is sent), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address: str = s.getsockname()[0]
    return None if address.startswith("127.") else address


class Server:
    """A host TCP listener that greets every client with `greeting` (a thread-free accept)."""

    def __init__(self, host: str, port: int, greeting: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(8)
        self.greeting = greeting
        self.port = port
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _GREETER, str(self.sock.fileno()), greeting],
            pass_fds=(self.sock.fileno(),),
        )

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.sock.close()


_GREETER = """
import socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[2].encode())
    c.close()
"""


@dataclass
class Box:
    """A home, a crew home and an agent dir for `crew-launcher sandbox`, owned by `uid`."""

    base: Path
    uid: int

    @property
    def home(self) -> Path:
        return self.base / "home"

    def launcher_argv(self, mode: str, ports: list[int], command: list[str]) -> list[str]:
        boot = f"import sys; sys.path[:0] = {[str(REPO), str(SITE)]!r}; "
        boot += "from sandbox_launcher.__main__ import main; sys.exit(main())"
        python = sys.executable if self.uid == os.getuid() else SYSTEM_PYTHON
        argv = [python, "-c", boot, "sandbox", "--mode", mode]
        argv += ["--agent-dir", str(self.home / "agent"), "--runtime-dir", str(self.home / "rt")]
        for port in ports:
            argv += ["--loopback-port", str(port)]
        return [*argv, "--", *command]

    def popen(self, argv: list[str]) -> subprocess.Popen[str]:
        other = self.uid != os.getuid()
        env = {"HOME": str(self.home), "CREW_HOME": str(self.home / ".crew")}
        env["PATH"] = "/usr/bin:/bin"
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd="/",
            user=self.uid if other else None,
            group=self.uid if other else None,
            extra_groups=[] if other else None,
            start_new_session=True,
        )


@contextlib.contextmanager
def made_box(who: str, prefix: str, probes: dict[str, str]) -> Iterator[Box]:
    """A home for `crew-launcher sandbox` owned by its user (`who`: "caller" or
    "unprivileged"), with `probes` (name → text) in the agent's directory."""
    if find_pasta() is None:
        required_in_ci("pasta (Debian package passt)")
    if find_nftables() is None:
        required_in_ci("libnftables (Debian package nftables): the sandbox's firewall")
    if not os.path.exists(SYSTEM_PYTHON):
        required_in_ci(f"{SYSTEM_PYTHON} (Debian package python3)")
    uid = os.getuid()
    if who == "unprivileged" and uid == 0:
        uid = unprivileged_uid()
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    base.chmod(0o755)
    b = Box(base, uid)
    for path in (b.home / "agent" / "work", b.home / "rt", b.home / ".crew" / "sockets"):
        path.mkdir(parents=True, mode=0o700)
    for name, text in probes.items():
        (b.home / "agent" / name).write_text(text)
    for path in [b.home, *b.home.rglob("*")]:
        os.lchown(path, uid, uid)
    try:
        yield b
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["caller", "unprivileged"])
def box(request: pytest.FixtureRequest, needs_bwrap: None) -> Iterator[Box]:
    with made_box(request.param, "crew-net-", {"probe.py": PROBE}) as b:
        yield b


def _read_checks(stream: IO[str], until: str) -> dict[str, dict[str, Any]]:
    checks: dict[str, dict[str, Any]] = {}
    for line in stream:
        if line.startswith("{"):
            row = json.loads(line)
            checks[row["check"]] = row
            if row["check"] == until:
                break
    return checks


def _knock(port: int, host: str = "127.0.0.1") -> str | None:
    """Connect like the Computer does and send its bearer token; the greeting, or None."""
    try:
        c = socket.create_connection((host, port), timeout=5)
    except OSError:
        return None
    with c:
        c.sendall(b"GET /computer/stream HTTP/1.1\r\nAuthorization: Bearer COMPUTER-TOKEN\r\n\r\n")
        c.settimeout(2)  # a squatter takes the token and says nothing
        try:
            return c.recv(100).decode() or "accepted"
        except TimeoutError:
            return "accepted"


def _attack(
    box: Box, mode: str, outside: tuple[str, int] | None
) -> tuple[dict[str, dict[str, Any]], dict[str, str | None], list[tuple[int, str]]]:
    """Run the probe; returns its checks, what the host reached, pasta seen, exit status."""
    server_port, wide_port, forwarded_port = free_port(), free_port(), free_port()
    unforwarded = Server("127.0.0.1", free_port(), "private-service")
    forwarded = Server("127.0.0.1", forwarded_port, "local-model")
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0crew-net-{uuid.uuid4().hex[:8]}")
    abstract.listen(1)
    cfg = {
        "server_port": server_port,  # the crew server's: forwarded, but the server is down
        "wide_port": wide_port,
        "unforwarded": unforwarded.port,
        "forwarded": forwarded_port,
        "abstract": abstract.getsockname().decode(),
        "outside": outside,
    }
    probe = [SYSTEM_PYTHON, "-I", str(box.home / "agent" / "probe.py"), json.dumps(cfg)]
    process = box.popen(box.launcher_argv(mode, [server_port, forwarded_port], probe))
    assert process.stdout is not None and process.stdin is not None
    try:
        checks = _read_checks(process.stdout, until="ready")
        assert "ready" in checks, process.communicate()
        pastas = [c for c in children_of(process.pid) if c[1].startswith("pas")]
        reached = {
            "server_port": _knock(server_port),
            "wide_port_loopback": _knock(wide_port),
            "wide_port_address": _knock(wide_port, outside[0]) if outside else None,
        }
        process.stdin.close()
        checks |= _read_checks(process.stdout, until="wide_received")
        process.stdout.read()
        err = process.stderr.read() if process.stderr else ""
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for server in (unforwarded, forwarded):
            server.close()
        abstract.close()
    assert process.returncode == 0, err
    return checks, reached, pastas


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_the_network_attacks_fail_and_the_agents_work_does_not(box: Box, mode: str) -> None:
    address = _host_address()
    outside_server = Server(address, free_port(), "lan-service") if address else None
    outside = (address, outside_server.port) if address and outside_server else None
    try:
        checks, reached, pastas = _attack(box, mode, outside)
    finally:
        if outside_server:
            outside_server.close()
    # Port squatting: the agent's listener on the crew server's port (while it is
    # down) never gets the Computer's connection, nor does one on 0.0.0.0.
    assert reached["server_port"] is None, reached
    assert reached["wide_port_loopback"] is None and reached["wide_port_address"] is None
    assert not checks["squat_received"]["worked"] and not checks["wide_received"]["worked"]
    # The host's loopback services and sockets stay out of reach.
    assert not checks["host_listener_visible"]["worked"], checks["read_proc_net_tcp"]
    assert not checks["unforwarded_loopback"]["worked"], checks["unforwarded_loopback"]
    assert not checks["abstract_socket"]["worked"], checks["abstract_socket"]
    # A service on the host's own non-loopback address is the host's too (issue 20, item 4):
    # out of reach (ordinary egress is shown in test_network_firewall, to a LAN host of its own).
    if outside is None:
        required_in_ci("a non-loopback IPv4 address on this machine (the host-address check)")
    else:
        assert not checks["host_own_address"]["worked"], checks["host_own_address"]
    # Positive control: the forwarded port (a local model) works.
    assert checks["forwarded_loopback"]["result"] == "'local-model'", checks["forwarded_loopback"]
    # pasta ran next to the sandbox, and nothing of it is left.
    assert pastas, "no pasta process was seen next to the sandbox"
    wait_until("pasta gone", lambda: all(not Path(f"/proc/{p}").exists() for p, _ in pastas))


def test_the_real_server_gets_the_computer_after_a_squat(box: Box) -> None:
    """The crew server restarts while an agent squats its port: the Computer reaches only it."""
    port = free_port()
    squat = (
        "import socket, sys; s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('127.0.0.1', {port})); s.listen(8); print('squatting', flush=True); "
        "sys.stdin.read()"
    )
    command = [SYSTEM_PYTHON, "-I", "-c", squat]
    process = box.popen(box.launcher_argv("hybrid", [port], command))
    assert process.stdout is not None and process.stdin is not None
    try:
        line = process.stdout.readline()
        # pasta's own listener holds the forwarded port inside: the squat fails…
        assert line != "squatting\n", line
        # …and whatever the agent did, the host's port is free for the real server.
        real = Server("127.0.0.1", port, "real-crew-server")
        try:
            assert _knock(port) == "real-crew-server"
        finally:
            real.close()
    finally:
        process.stdin.close()
        process.stdout.read()
        process.wait(timeout=60)


@pytest.mark.parametrize("mode", [LinuxMode.HYBRID, LinuxMode.TMPFS])
def test_the_probe_sees_the_escapes_without_a_namespace(mode: LinuxMode, needs_bwrap: None) -> None:
    """Control: the same sandbox minus its network namespace (the state before issue 12)."""
    backend, health = open_backend(mode)
    assert isinstance(backend, BwrapBackend), health
    base = Path(tempfile.mkdtemp(prefix="crew-net-control-", dir="/var/tmp"))
    try:
        home = base / "home"
        policy = SandboxPolicy(
            home=home,
            crew_home=home / ".crew",
            agent_dir=home / "agent",
            runtime_dir=home / "rt",
            tmp_dir=home / "rt" / "tmp",
            work_dir=home / "agent",
            read_dirs=(Path("/usr"),),
        )
        for path in (policy.tmp_dir, policy.agent_dir, policy.crew_home / "sockets"):
            path.mkdir(parents=True)
        (policy.agent_dir / "probe.py").write_text(PROBE)
        server_port, wide_port, forwarded_port = free_port(), free_port(), free_port()
        unforwarded = Server("127.0.0.1", free_port(), "private-service")
        cfg = {
            "server_port": server_port,
            "wide_port": wide_port,
            "unforwarded": unforwarded.port,
            "forwarded": forwarded_port,
            "abstract": "\0crew-net-none",
        }
        probe = [SYSTEM_PYTHON, "-I", str(policy.agent_dir / "probe.py"), json.dumps(cfg)]
        process = subprocess.Popen(
            backend.argv(policy, probe),  # no `network`: the host's namespace
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert process.stdout is not None and process.stdin is not None
        try:
            checks = _read_checks(process.stdout, until="ready")
            squatted = _knock(server_port)
            process.stdin.close()
            checks |= _read_checks(process.stdout, until="wide_received")
        finally:
            process.kill()
            process.wait()
            unforwarded.close()
        assert squatted == "accepted" and checks["squat_received"]["worked"], checks
        assert checks["host_listener_visible"]["worked"]
        assert checks["unforwarded_loopback"]["result"] == "'private-service'"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("mode", [LinuxMode.HYBRID, LinuxMode.TMPFS])
def test_a_loopback_resolver_is_replaced_by_the_upstream_list(
    mode: LinuxMode, needs_bwrap: None
) -> None:
    """systemd-resolved's stub (127.0.0.53) is out of reach inside: the sandbox sees upstream."""
    backend, health = open_backend(mode)
    assert isinstance(backend, BwrapBackend) and backend.pasta, health
    base = Path(tempfile.mkdtemp(prefix="crew-net-dns-", dir="/var/tmp"))
    try:
        host_conf = Path(os.path.realpath("/etc/resolv.conf"))
        upstream = base / "upstream-resolv.conf"  # what systemd-resolved would list
        upstream.write_text(host_conf.read_text() + "# crew test upstream\n")
        upstream.chmod(0o644)
        home = base / "home"
        policy = SandboxPolicy(
            home=home,
            crew_home=home / ".crew",
            agent_dir=home / "agent",
            runtime_dir=home / "rt",
            tmp_dir=home / "rt" / "tmp",
            work_dir=home / "agent",
        )
        for path in (policy.tmp_dir, policy.agent_dir, policy.crew_home / "sockets"):
            path.mkdir(parents=True)
        network = SandboxNetwork(backend.pasta, NetworkPlan(), (str(upstream), str(host_conf)))
        command = ["/bin/sh", "-c", "cat /etc/resolv.conf; getent hosts deb.debian.org || true"]
        process = subprocess.Popen(
            network.argv(backend.argv(policy, command)),
            stdout=subprocess.PIPE,
            pass_fds=network.pass_fds,
            env={"PATH": "/usr/bin:/bin"},
        )
        try:
            network.spawned()
            network.attach_blocking()
            out, _ = process.communicate(timeout=60)
        finally:
            network.close()
        assert "# crew test upstream" in out.decode()
        if (
            subprocess.run(["getent", "hosts", "deb.debian.org"], capture_output=True).returncode
            == 0
        ):
            assert "deb.debian.org" in out.decode().split("# crew test upstream", 1)[1]
    finally:
        shutil.rmtree(base, ignore_errors=True)
