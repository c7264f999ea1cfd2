"""The sandbox's own firewall (issue 20, items 4 and 5): no host address, a connection cap.

Item 4: pasta answers a connection to any outside address with a host
socket's `connect()`, so the host's own non-loopback addresses led to every
service bound to 0.0.0.0/:: on the host (an Ollama with OLLAMA_HOST=0.0.0.0,
`docker -p` ports). The test makes its own "host": a network namespace with
a veth to a second namespace (a LAN host, the positive control of ordinary
egress) and a second host address on another device (its `lo`), and runs
`crew-launcher sandbox` inside it. Addresses are documentation ranges
(198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32) that exist only there.

Item 5: one sandbox held 3,000 connections through pasta to the crew
server's port. With `--max-connections` the sandbox's connections past the
cap are refused, the listener never holds more than the cap, and once they
are closed new ones work again.

Both Linux modes, as root (CI) and as an unprivileged user the test makes.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crew_harness.ports import free_port
from sandbox_launcher.network import find_nftables, find_pasta
from tests.launcher.helpers import LauncherProcess, engine_lines, make_layout, write_fake_opencode
from tests.launcher.test_network import SYSTEM_PYTHON, Box, _read_checks, made_box
from tests.support.ci import required_in_ci

NSENTER = "/usr/bin/nsenter"
SETPRIV = "/usr/bin/setpriv"
HOST4, LAN4, HOST4_OTHER = "198.51.100.1", "198.51.100.2", "203.0.113.1"
HOST6, LAN6 = "2001:db8:20::1", "2001:db8:20::2"

# A TCP listener that greets each client, closes on the client's EOF and, when
# its stdin closes, prints how many it accepted and the most it held at once.
HOLDER = r"""
import json, selectors, socket, sys
listeners = []
for host in sys.argv[1].split(","):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if ":" in host:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((host, int(sys.argv[2])))
    s.listen(512)
    listeners.append(s)
sel = selectors.DefaultSelector()
for s in listeners:
    sel.register(s, selectors.EVENT_READ, "listen")
sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
accepted = held = most = 0
print("ready", flush=True)
while True:
    for key, _ in sel.select():
        if key.data == "stdin":
            print(json.dumps({"accepted": accepted, "most": most}), flush=True)
            sys.exit(0)
        if key.data == "listen":
            conn, _ = key.fileobj.accept()
            conn.sendall(sys.argv[3].encode())
            sel.register(conn, selectors.EVENT_READ, "conn")
            accepted += 1
            held += 1
            most = max(most, held)
        else:
            try:
                data = key.fileobj.recv(100)
            except ConnectionError:
                data = b""  # a client gone with a reset (pasta's close, or unread greeting)
            if not data:
                sel.unregister(key.fileobj)
                key.fileobj.close()
                held -= 1
"""

# Inside the sandbox: first try to remove the firewall (as the agent, and as root of a
# user namespace of its own), then one JSON line per target, whether it greeted us.
REACH_PROBE = r"""
import json, socket, subprocess, sys
for name, argv in (
    ("flush", ["/usr/sbin/nft", "flush", "ruleset"]),
    ("flush_in_own_userns", ["/usr/bin/unshare", "-r", "/usr/sbin/nft", "flush", "ruleset"]),
):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        said = (done.stdout + done.stderr)[-300:]
        print(json.dumps({"check": name, "worked": done.returncode == 0, "error": said}), flush=True)
    except OSError as exc:
        print(json.dumps({"check": name, "worked": False, "error": str(exc)}), flush=True)
for name, host, port in json.loads(sys.argv[1]):
    try:
        with socket.create_connection((host, port), timeout=10) as c:
            c.settimeout(10)
            got = c.recv(100).decode()
        print(json.dumps({"check": name, "worked": True, "result": got}), flush=True)
    except OSError as exc:
        print(json.dumps({"check": name, "worked": False, "error": str(exc)}), flush=True)
print(json.dumps({"check": "done", "worked": True}), flush=True)
"""

# Inside the sandbox: `tries` connections to a listener of its own (not through pasta:
# not counted) held open, then `tries` to the forwarded port; close those; then
# connect again until one works (closed connections leave the count at once,
# but the kernel frees them lazily, within a jiffy).
CAP_PROBE = r"""
import json, socket, sys, time
port, tries = int(sys.argv[1]), int(sys.argv[2])
own = socket.socket()
own.bind(("127.0.0.1", 0))
own.listen(512)
mine = []
try:
    for _ in range(tries):
        mine.append(socket.create_connection(own.getsockname(), timeout=10))
        mine.append(own.accept()[0])
except OSError as exc:
    print(json.dumps({"check": "own_loopback", "worked": False, "error": str(exc)}), flush=True)
print(json.dumps({"check": "own_loopback", "worked": True, "result": len(mine) // 2}), flush=True)
held, refused = [], None
for i in range(tries):
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=10)
        c.settimeout(10)
        if c.recv(100) != b"crew-server":
            raise OSError("no greeting")
        held.append(c)
    except OSError as exc:
        refused = str(exc)
        break
print(json.dumps({"check": "held", "worked": True, "result": len(held), "error": refused}), flush=True)
for c in held:
    c.close()
again = None
for _ in range(500):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            c.settimeout(10)
            again = c.recv(100).decode()
        break
    except OSError as exc:
        again = None
        time.sleep(0.02)
print(json.dumps({"check": "again", "worked": again is not None, "result": again}), flush=True)
"""


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, (argv, done.stderr)


class HostNamespace:
    """A network namespace as the sandbox's host: veth to a LAN host's namespace, another address on its lo."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.host, self.lan = f"crewh-{tag}", f"crewl-{tag}"
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def _make(self) -> None:
        _run(["ip", "netns", "add", self.host])
        _run(["ip", "netns", "add", self.lan])
        h, lan = ["ip", "-n", self.host], ["ip", "-n", self.lan]
        _run(
            [*h, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns", self.lan]
        )
        _run([*h, "addr", "add", f"{HOST4}/24", "dev", "veth0"])
        _run([*h, "addr", "add", f"{HOST6}/64", "dev", "veth0", "nodad"])
        _run([*h, "addr", "add", f"{HOST4_OTHER}/32", "dev", "lo"])  # anycast-like, no dummy here
        _run([*lan, "addr", "add", f"{LAN4}/24", "dev", "veth1"])
        _run([*lan, "addr", "add", f"{LAN6}/64", "dev", "veth1", "nodad"])
        for ns in (h, lan):
            _run([*ns, "link", "set", "lo", "up"])
        _run([*h, "link", "set", "veth0", "up"])
        _run([*lan, "link", "set", "veth1", "up"])
        _run([*h, "route", "add", "default", "via", LAN4])
        _run([*h, "-6", "route", "add", "default", "via", LAN6])

    def wait_reachable(self, address: str, port: int, timeout_s: float = 15.0) -> None:
        """Until the host namespace connects to `address:port` (a fresh veth's IPv6 can
        take a second before it carries traffic): the test's LAN is up before it is used."""
        probe = (
            "import socket, sys, time\n"
            "end = time.monotonic() + float(sys.argv[3])\n"
            "while True:\n"
            "    try:\n"
            "        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()\n"
            "        break\n"
            "    except OSError:\n"
            "        if time.monotonic() > end:\n"
            "            sys.exit(f'{sys.argv[1]} port {sys.argv[2]}: {sys.exc_info()[1]}')\n"
            "        time.sleep(0.1)\n"
        )
        _run(
            [
                *self.enter(self.host),
                SYSTEM_PYTHON,
                "-I",
                "-c",
                probe,
                address,
                str(port),
                str(timeout_s),
            ]
        )

    def enter(self, ns: str, uid: int | None = None) -> list[str]:
        """The argv prefix that runs a command in namespace `ns`, as `uid` when given."""
        prefix = [NSENTER, f"--net=/run/netns/{ns}", "--"]
        if uid is not None:
            prefix += [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        return prefix

    def close(self) -> None:
        for ns in (self.host, self.lan):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, check=False)


class Holder:
    """A `HOLDER` listener, in a namespace (a prefix from `HostNamespace.enter`) or on the host."""

    def __init__(self, hosts: str, port: int, greeting: str, prefix: list[str] = []) -> None:  # noqa: B006 - never mutated
        self.proc = subprocess.Popen(
            [*prefix, SYSTEM_PYTHON, "-I", "-c", HOLDER, hosts, str(port), greeting],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "ready\n"

    def counts(self) -> dict[str, int]:
        """Stop it; how many it accepted and the most it held at once."""
        out, _ = self.proc.communicate(timeout=60)
        counts: dict[str, int] = json.loads(out)
        return counts

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(params=["caller", "unprivileged"])
def netbox(request: pytest.FixtureRequest, needs_bwrap: None) -> Iterator[Box]:
    """A home for `crew-launcher sandbox` (as `test_network.box`), owned by its user."""
    probes = {"reach.py": REACH_PROBE, "cap.py": CAP_PROBE}
    with made_box(request.param, "crew-fw-", probes) as b:
        yield b


def _sandboxed(
    box: Box, mode: str, ports: list[int], command: list[str], prefix: list[str], cap: int | None
) -> dict[str, dict[str, Any]]:
    """Run `command` through `crew-launcher sandbox` (after `prefix`); its JSON checks."""
    argv = box.launcher_argv(mode, ports, command)
    if cap is not None:
        at = argv.index("sandbox") + 1
        argv[at:at] = ["--max-connections", str(cap)]
    other = box.uid != os.getuid()
    if other and not prefix:
        prefix = [SETPRIV, f"--reuid={box.uid}", f"--regid={box.uid}", "--clear-groups", "--"]
    checks, _ = run_checks(box, [*prefix, *argv])
    return checks


def run_checks(box: Box, argv: list[str]) -> tuple[dict[str, dict[str, Any]], str]:
    """Run a `crew-launcher sandbox` argv (with its namespace/user prefix) with the box's
    HOME; its JSON checks and its stderr. It must exit 0."""
    env = {"HOME": str(box.home), "CREW_HOME": str(box.home / ".crew"), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd="/",
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        checks = _read_checks(process.stdout, until="\0never")
        err = process.stderr.read() if process.stderr else ""
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    return checks, err


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_the_hosts_own_addresses_are_refused_and_egress_is_not(netbox: Box, mode: str) -> None:
    if os.getuid() != 0:
        required_in_ci("root, to make the test's network namespaces")
    host = HostNamespace()
    holders: list[Holder] = []
    try:
        port, lan_port, server_port = free_port(), free_port(), free_port()
        # "Ollama with OLLAMA_HOST=0.0.0.0": every address of the host, v4 and v6.
        wide = Holder("0.0.0.0,::", port, "host-service", host.enter(host.host))
        crew = Holder("127.0.0.1", server_port, "crew-server", host.enter(host.host))
        lan = Holder(f"{LAN4},{LAN6}", lan_port, "lan-service", host.enter(host.lan))
        holders += [wide, crew, lan]
        host.wait_reachable(LAN4, lan_port)
        host.wait_reachable(LAN6, lan_port)
        targets = [
            ("host_address", HOST4, port),
            ("host_other_address", HOST4_OTHER, port),
            ("host_address_v6", HOST6, port),
            ("gateway", "10.0.2.2", port),
            ("gateway_v6", "fd63:7265:7700::2", port),
            ("forwarded_loopback", "127.0.0.1", server_port),
            ("lan_host", LAN4, lan_port),
            ("lan_host_v6", LAN6, lan_port),
        ]
        probe = [SYSTEM_PYTHON, "-I", str(netbox.home / "agent" / "reach.py"), json.dumps(targets)]
        uid = netbox.uid if netbox.uid != os.getuid() else None
        checks = _sandboxed(netbox, mode, [server_port], probe, host.enter(host.host, uid), None)
        assert "done" in checks, checks
        # The agent cannot take its firewall down (no capability in its namespace's owner).
        assert not checks["flush"]["worked"], checks["flush"]
        assert not checks["flush_in_own_userns"]["worked"], checks["flush_in_own_userns"]
        # The attack: the host's 0.0.0.0/:: service through any of its own addresses.
        for name in ("host_address", "host_other_address", "host_address_v6"):
            assert not checks[name]["worked"], checks[name]
        for name in ("gateway", "gateway_v6"):
            assert not checks[name]["worked"], checks[name]
        assert wide.counts()["accepted"] == 0
        # Positive controls: the forwarded crew-server port and a host on the LAN.
        assert checks["forwarded_loopback"].get("result") == "crew-server", checks[
            "forwarded_loopback"
        ]
        assert checks["lan_host"].get("result") == "lan-service", checks["lan_host"]
        assert checks["lan_host_v6"].get("result") == "lan-service", checks["lan_host_v6"]
    finally:
        for holder in holders:
            holder.close()
        host.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_connections_past_the_cap_are_refused_and_closed_ones_free_it(
    netbox: Box, mode: str
) -> None:
    cap, tries = 16, 40
    server_port = free_port()
    crew = Holder("127.0.0.1", server_port, "crew-server")
    try:
        probe = [SYSTEM_PYTHON, "-I", str(netbox.home / "agent" / "cap.py")]
        probe += [str(server_port), str(tries)]
        checks = _sandboxed(netbox, mode, [server_port], probe, [], cap)
        counts = crew.counts()
    finally:
        crew.close()
    # The attack: `tries` connections through pasta to the crew server's port.
    assert checks["held"]["result"] == cap, checks["held"]
    assert "refused" in (checks["held"]["error"] or ""), checks["held"]
    assert counts["most"] == cap, counts
    # Positive control: the agent's own loopback (a test server of its) is not capped.
    assert checks["own_loopback"]["result"] == tries, checks["own_loopback"]
    # Positive control: once closed, a new connection works (and the first `cap` did).
    assert checks["again"]["result"] == "crew-server", checks["again"]
    assert counts["accepted"] == cap + 1, counts


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_a_launcher_run_gets_the_cap_of_its_max_connections(
    mode: str, needs_bwrap: None, isolated_home: Path, tmp_path: Path
) -> None:
    """`POST /runs` (the async attach, as a warm server's): the launcher's --max-connections."""
    if find_pasta() is None:
        required_in_ci("pasta (Debian package passt)")
    if find_nftables() is None:
        required_in_ci("libnftables (Debian package nftables)")
    cap, tries = 8, 20
    layout = make_layout(isolated_home)
    layout.add_agent("alice")
    server_port = free_port()
    crew = Holder("127.0.0.1", server_port, "crew-server")
    launcher = LauncherProcess(
        layout,
        write_fake_opencode(tmp_path / "bin"),
        mode=mode,
        extra_args=("--max-connections", str(cap)),
    )
    try:
        probe = [SYSTEM_PYTHON, "-I", "-c", CAP_PROBE, str(server_port), str(tries)]
        body = layout.run_request(
            "alice",
            {"scenario": "commands", "commands": {"cap": probe}},
            loopback_ports=[server_port],
        )
        lines = engine_lines(launcher.run(body))
        counts = crew.counts()
    finally:
        crew.close()
        code, err = launcher.stop()
    assert code == 0, err
    (cap_line,) = [line for line in lines if line.get("check") == "cap"]
    checks = {row["check"]: row for row in map(json.loads, cap_line["out"].splitlines())}
    assert checks["held"]["result"] == cap, checks
    assert checks["own_loopback"]["result"] == tries, checks
    assert checks["again"]["result"] == "crew-server", checks
    assert counts == {"accepted": cap + 1, "most": cap}, counts
