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
from typing import Any

import pytest

from crew_harness.ports import free_port
from sandbox_launcher.network import find_nftables, find_pasta
from tests.launcher.test_network import SYSTEM_PYTHON, Box, _read_checks
from tests.launcher.test_network_firewall import (
    SETPRIV,
    Holder,
    HostNamespace,
    _run,
    netbox,  # noqa: F401 - the fixture
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
        for address in (f"{LAN}/32", f"{METADATA}/32", f"{PUBLIC}/32"):
            _run([*far, "addr", "add", address, "dev", "veth1"])
        _run([*far, "addr", "add", f"{PUBLIC6}/128", "dev", "veth1", "nodad"])
        yield host
    finally:
        host.close()


def _sandboxed(
    box: Box, host: HostNamespace, egress: list[str], ports: list[int], command: list[str]
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """`command` through `crew-launcher sandbox --egress …` in the host namespace: its JSON
    checks and the denials the launcher wrote."""
    argv = box.launcher_argv("hybrid", ports, command)
    at = argv.index("sandbox") + 1
    argv[at:at] = egress
    prefix = [*host.enter(host.host)]
    if box.uid != os.getuid():
        prefix += [SETPRIV, f"--reuid={box.uid}", f"--regid={box.uid}", "--clear-groups", "--"]
    env = {"HOME": str(box.home), "CREW_HOME": str(box.home / ".crew"), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen(
        [*prefix, *argv],
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
