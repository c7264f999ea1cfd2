"""Each egress mode, in packets (issue 23): what must pass passes, what must not is refused
and recorded.

Packets go only inside network namespaces the test makes (`HostNamespace`, as
test_network_firewall's): the sandbox's "host" reaches, through a veth, a
second namespace that holds a "LAN" host (10.99.0.1), the cloud "metadata"
address (169.254.169.254) and "public" hosts (203.0.113.10, 2001:db8::10,
documentation ranges, which the policy counts as public). `crew-launcher
sandbox` runs in the host namespace with `--egress`; its stderr names each
refusal the firewall recorded. As root and as an unprivileged user the test
makes.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crew_harness.ports import free_port
from sandbox_launcher.network import find_nftables, find_pasta
from tests.launcher.test_network import SYSTEM_PYTHON, Box
from tests.launcher.test_network_firewall import (
    LAN4,
    SETPRIV,
    Holder,
    HostNamespace,
    _run,
    netbox,  # noqa: F401 - the fixture
    run_checks,
)
from tests.support.ci import required_in_ci

LAN, METADATA, PUBLIC, PUBLIC6 = "10.99.0.1", "169.254.169.254", "203.0.113.10", "2001:db8::10"
DENIED = "crew-launcher sandbox: egress denied: "


@pytest.fixture
def internet() -> Iterator[HostNamespace]:
    """The test's own network with the LAN, metadata and public hosts on its far side."""
    if os.getuid() != 0:
        required_in_ci("root, to make the test's network namespaces")
    if find_pasta() is None or find_nftables() is None:
        required_in_ci("pasta and libnftables (Debian packages passt, nftables)")
    host = HostNamespace()
    try:
        far = ["ip", "-n", host.lan]
        for address in (f"{LAN}/32", f"{METADATA}/32", f"{PUBLIC}/32", "203.0.113.12/32"):
            _run([*far, "addr", "add", address, "dev", "veth1"])
        _run([*far, "addr", "add", f"{PUBLIC6}/128", "dev", "veth1", "nodad"])
        yield host
    finally:
        host.close()


def _sandboxed(
    box: Box,
    host: HostNamespace,
    egress: list[str],
    ports: list[int],
    command: list[str],
    prefix: list[str] | None = None,
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """`command` through `crew-launcher sandbox --egress …` in the host namespace (or after
    `prefix`): its JSON checks and the denials the launcher wrote."""
    argv = box.launcher_argv("hybrid", ports, command)
    at = argv.index("sandbox") + 1
    argv[at:at] = egress
    prefix = list(prefix or host.enter(host.host))
    if box.uid != os.getuid():
        prefix += [SETPRIV, f"--reuid={box.uid}", f"--regid={box.uid}", "--clear-groups", "--"]
    checks, err = run_checks(box, [*prefix, *argv])
    denials = [json.loads(line[len(DENIED) :]) for line in err.splitlines() if DENIED in line]
    return checks, denials


CASES = {
    # mode: (its argv, the targets that pass; every other one is refused and recorded)
    "open": ([], {"lan", "metadata", "public", "public_v6", "mapped_lan"}),
    "public": ([], {"public", "public_v6"}),
    "allow": (["--allow", f"{PUBLIC}:PORT", "--allow", "[2001:db8::/32]:1"], {"public"}),
    "none": ([], set()),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", sorted(CASES))
def test_each_mode_passes_what_it_allows_and_records_what_it_refuses(
    netbox: Box,  # noqa: F811 - the fixture
    internet: HostNamespace,
    mode: str,
) -> None:
    port, server_port = free_port(), free_port()
    far = Holder("0.0.0.0,::", port, "far-service", internet.enter(internet.lan))
    crew = Holder("127.0.0.1", server_port, "crew-server", internet.enter(internet.host))
    try:
        targets = [
            ("lan", LAN, port),
            ("metadata", METADATA, port),
            ("public", PUBLIC, port),
            ("public_v6", PUBLIC6, port),
            ("mapped_lan", f"::ffff:{LAN}", port),
            ("forwarded_loopback", "127.0.0.1", server_port),
        ]
        probe = [SYSTEM_PYTHON, "-I", str(netbox.home / "agent" / "reach.py"), json.dumps(targets)]
        rules, passing = CASES[mode]
        egress = ["--egress", mode, *(r.replace("PORT", str(port)) for r in rules)]
        checks, denials = _sandboxed(netbox, internet, egress, [server_port], probe)
    finally:
        far.close()
        crew.close()
    assert "done" in checks, checks
    # The forwarded crew-server port works in every mode (`none` included).
    assert checks["forwarded_loopback"].get("result") == "crew-server", checks
    recorded = {(d["address"], d["port"], d["protocol"]) for d in denials}
    for name, address, _ in targets[:-1]:
        if name in passing:
            assert checks[name].get("result") == "far-service", (name, checks[name])
        else:
            assert not checks[name]["worked"], (name, checks[name])
            assert "refused" in checks[name]["error"], (name, checks[name])
            # IPv4-mapped goes out as IPv4: recorded under the IPv4 address.
            shown = address.removeprefix("::ffff:")
            assert (shown, port, "tcp") in recorded, (name, denials)
    assert all(d["count"] >= 1 and d["name"] is None for d in denials), denials
    if mode == "open":
        assert denials == [], denials


@pytest.mark.parametrize(
    ("egress", "reason"),
    [
        (["--egress", "allow", "--allow", "not a name"], "is not a host name, address or range"),
        (["--egress", "public", "--allow", "example.org"], "takes no allow rules"),
    ],
)
def test_a_bad_policy_is_refused_before_anything_runs(
    netbox: Box,  # noqa: F811 - the fixture
    egress: list[str],
    reason: str,
) -> None:
    argv = netbox.launcher_argv("hybrid", [], ["/bin/true"])
    at = argv.index("sandbox") + 1
    argv[at:at] = egress
    env = {"HOME": str(netbox.home), "CREW_HOME": str(netbox.home / ".crew")}
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    assert done.returncode != 0 and reason in done.stderr, done.stderr


# The test's own nameserver, in the far namespace: A records for the test's names.
DNS_SERVER = r"""
import socket, struct, sys
names = {"allowed.test": "203.0.113.10", "rebind.test": "169.254.169.254",
         "other.test": "203.0.113.11", "a.wild.test": "203.0.113.12"}
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 53))
print("ready", flush=True)
while True:
    packet, peer = s.recvfrom(4096)
    qid, flags = struct.unpack("!HH", packet[:4])
    labels, at = [], 12
    while packet[at]:
        labels.append(packet[at + 1 : at + 1 + packet[at]].decode())
        at += 1 + packet[at]
    qtype = struct.unpack("!H", packet[at + 1 : at + 3])[0]
    question = packet[12 : at + 5]
    name = ".".join(labels).lower()
    address = names.get(name)
    answers = b""
    if address and qtype == 1:
        answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 300, 4) + socket.inet_aton(address)
    rcode = 0 if address else 3
    header = struct.pack("!HHHHHH", qid, 0x8180 | rcode, 1, 1 if answers else 0, 0, 0)
    s.sendto(header + question + answers, peer)
"""


def _with_resolv_conf(host: HostNamespace, conf: str) -> list[str]:
    """A prefix: the host namespace, with `conf` as its /etc/resolv.conf (own mount namespace)."""
    script = 'mount --bind "$1" /etc/resolv.conf && shift && exec "$@"'
    unshare = ["/usr/bin/unshare", "-m", "--propagation", "private", "--"]
    return [*host.enter(host.host), *unshare, "/bin/sh", "-c", script, "sh", conf]


DNS_CASES = {
    # mode: (its argv, the targets that pass)
    "allow": (
        ["--allow", "allowed.test:PORT", "--allow", "rebind.test", "--allow", "*.wild.test:PORT"],
        {"allowed_name", "wildcard_name"},
    ),
    "none": ([], set()),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", sorted(DNS_CASES))
def test_names_resolve_only_when_allowed_and_to_public_addresses(
    netbox: Box,  # noqa: F811 - the fixture
    internet: HostNamespace,
    mode: str,
    tmp_path: Path,
) -> None:
    port, other_port, server_port = free_port(), free_port(), free_port()
    far = Holder("0.0.0.0", port, "far-service", internet.enter(internet.lan))
    far_other = Holder("0.0.0.0", other_port, "far-other", internet.enter(internet.lan))
    crew = Holder("127.0.0.1", server_port, "crew-server", internet.enter(internet.host))
    dns = subprocess.Popen(
        [*internet.enter(internet.lan), SYSTEM_PYTHON, "-I", "-c", DNS_SERVER, LAN4],
        stdout=subprocess.PIPE,
        text=True,
    )
    conf = tmp_path / "resolv.conf"
    conf.write_text(f"nameserver {LAN4}\n")
    conf.chmod(0o644)
    try:
        assert dns.stdout is not None and dns.stdout.readline() == "ready\n"
        targets = [
            ("allowed_name", "allowed.test", port),
            ("allowed_name_other_port", "allowed.test", other_port),
            ("wildcard_name", "a.wild.test", port),
            ("rebind_name", "rebind.test", port),
            ("other_name", "other.test", port),
            ("other_address", "203.0.113.11", port),
            ("forwarded_loopback", "127.0.0.1", server_port),
        ]
        probe = [SYSTEM_PYTHON, "-I", str(netbox.home / "agent" / "reach.py"), json.dumps(targets)]
        rules, passing = DNS_CASES[mode]
        egress = ["--egress", mode, *(r.replace("PORT", str(port)) for r in rules)]
        prefix = _with_resolv_conf(internet, str(conf))
        checks, denials = _sandboxed(netbox, internet, egress, [server_port], probe, prefix)
    finally:
        for holder in (far, far_other, crew):
            holder.close()
        dns.kill()
        dns.wait()
    assert "done" in checks, checks
    assert checks["forwarded_loopback"].get("result") == "crew-server", checks
    for name, _, _ in targets[:-1]:
        if name in passing:
            assert checks[name].get("result") == "far-service", (name, checks[name])
        else:
            assert not checks[name]["worked"], (name, checks[name])
    by_name = {(d["name"], d["address"], d["port"]) for d in denials}
    # A name no rule lists is not resolved, and recorded with its name.
    assert ("other.test", "", 53) in by_name, denials
    if mode == "allow":
        # Resolved, but to a private address: refused at connect, recorded with the name.
        assert ("rebind.test", METADATA, port) in by_name, denials
        # An allowed name on a port its rule does not list.
        assert ("allowed.test", PUBLIC, other_port) in by_name, denials
        # The address itself (another name's) without a rule for it.
        assert (None, "203.0.113.11", port) in by_name or (
            "other.test",
            "203.0.113.11",
            port,
        ) in by_name, denials
    else:
        assert ("allowed.test", "", 53) in by_name, denials


# Inside the sandbox: UDP datagrams to each target, then `done`.
UDP_PROBE = r"""
import json, socket, sys
for host, port in json.loads(sys.argv[1]):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        for _ in range(3):
            try:
                s.sendto(b"x", (host, port))
            except OSError:
                pass  # a refusal shows as the next send's error
print(json.dumps({"check": "done", "worked": True}), flush=True)
"""


@pytest.mark.timeout(300)
def test_public_refuses_and_records_udp_to_the_lan_but_not_to_the_internet(
    netbox: Box,  # noqa: F811 - the fixture
    internet: HostNamespace,
) -> None:
    port = free_port()
    targets = [(LAN, port), (METADATA, port), (PUBLIC, port), (PUBLIC6, port)]
    probe = [SYSTEM_PYTHON, "-I", "-c", UDP_PROBE, json.dumps(targets)]
    checks, denials = _sandboxed(netbox, internet, ["--egress", "public"], [], probe)
    assert "done" in checks, checks
    udp = {(d["address"], d["port"]): d["count"] for d in denials if d["protocol"] == "udp"}
    assert udp.get((LAN, port), 0) >= 1 and udp.get((METADATA, port), 0) >= 1, denials
    assert (PUBLIC, port) not in udp and (PUBLIC6, port) not in udp, denials
