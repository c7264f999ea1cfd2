"""The pure parts of `sandbox_launcher.network`: pasta's argv, bwrap's sync options, /proc parsing."""

from __future__ import annotations

import pytest

from sandbox_launcher.backend import health_note
from sandbox_launcher.bwrap import LinuxMode
from sandbox_launcher.network import (
    NO_FIREWALL_NOTE,
    OPEN,
    NetworkPlan,
    PastaTools,
    child_pid,
    firewall_ruleset,
    has_default_route,
    inet6_addresses,
    listening_ports,
    local_networks,
    loopback_addressed,
    nameservers,
    pasta_argv,
    resolver_for_sandbox,
    sandbox_failure,
    with_network,
)
from sandbox_launcher.nft_helper import helper_argv

TOOLS = PastaTools(pasta="/usr/bin/pasta", setpriv="/usr/bin/setpriv")
BASE = [
    "/usr/bin/setpriv", "--pdeathsig", "KILL", "--", "/usr/bin/pasta", "-f", "-q",
    "--config-net", "--no-map-gw",
    "-a", "10.0.2.100", "-n", "24", "-g", "10.0.2.2",
    "-a", "fd63:7265:7700::100", "-g", "fd63:7265:7700::2",
]  # fmt: skip
NS = ["--no-netns-quit", "--userns", "/proc/self/fd/7", "--netns", "/proc/self/fd/8"]


@pytest.mark.parametrize(
    ("plan", "as_root", "middle"),
    [
        # Nothing in, nothing of the host's loopback out: never pasta's `auto`.
        (NetworkPlan(), False, ["-t", "none", "-u", "none", "-T", "none", "-U", "none"]),
        (
            NetworkPlan(loopback_ports=(8080, 11434, 8080)),
            False,
            ["-t", "none", "-u", "none", "-T", "8080,11434", "-U", "none"],
        ),
        (
            NetworkPlan(loopback_ports=(8080,), publish=(4096, 40123)),
            True,
            [
                "-t",
                "127.0.0.1/40123:4096",
                "-u",
                "none",
                "-T",
                "8080",
                "-U",
                "none",
                "--runas",
                "0",
            ],
        ),
    ],
)
def test_pasta_argv(plan: NetworkPlan, as_root: bool, middle: list[str]) -> None:
    assert pasta_argv(TOOLS, (7, 8), plan, as_root) == [*BASE, *middle, *NS]


def test_with_network_goes_right_after_bwrap() -> None:
    argv = ["/usr/bin/env", "--ignore-signal=INT", "/usr/bin/bwrap", "--unshare-user", "--", "sh"]
    assert with_network(argv, 5, 6) == [
        "/usr/bin/env", "--ignore-signal=INT", "/usr/bin/bwrap",
        "--unshare-net", "--info-fd", "5", "--block-fd", "6",
        "--unshare-user", "--", "sh",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="not a bwrap argv"):
        with_network(["/usr/bin/sandbox-exec", "-f", "x"], 5, 6)


@pytest.mark.parametrize(
    ("info", "pid"),
    [
        (b'{\n    "child-pid": 4242\n}\n', 4242),
        (b'{\n    "child-pid": 42', None),  # still arriving
        (b'{"child-pid": "42"}', None),
        (b"[]", None),
        (b"", None),
    ],
)
def test_child_pid(info: bytes, pid: int | None) -> None:
    assert child_pid(info) == pid


PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 00000000:2C8C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0100007F:1F90 0100007F:D22C 01 00000000:00000000 00:00000000 00000000     0        0 3 1
   3: 0100007F:2C8C 0100007F:1F90 06 00000000:00000000 00:00000000 00000000     0        0 0 3
"""


def test_listening_ports_on_loopback_only() -> None:
    assert listening_ports(PROC_NET_TCP) == {8080}
    assert listening_ports(PROC_NET_TCP, "00000000") == {11404}


def test_default_route() -> None:
    head = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    link = "eth0\t0002000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
    default = "eth0\t00000000\t0202000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
    assert has_default_route(head + link + default)
    assert not has_default_route(head + link)
    assert not has_default_route("")


# /proc/<pid>/net/fib_trie of a fresh namespace, after bwrap's RTM_NEWADDR, after lo is up.
FIB_ADDRESSED = (
    "Main:\n  |-- 127.0.0.1\n     /32 host LOCAL\nLocal:\n  |-- 127.0.0.1\n     /32 host LOCAL\n"
)
FIB_UP = """Local:
  +-- 127.0.0.0/8 2 0 2
     +-- 127.0.0.0/31 1 0 0
        |-- 127.0.0.0
           /8 host LOCAL
        |-- 127.0.0.1
           /32 host LOCAL
     |-- 127.255.255.255
        /32 link BROADCAST
"""


@pytest.mark.parametrize(
    ("fib_trie", "addressed"),
    [("", False), (FIB_ADDRESSED, True), (FIB_UP, True), ("Local:\n  |-- 127.0.0.10\n", False)],
)
def test_loopback_addressed(fib_trie: str, addressed: bool) -> None:
    assert loopback_addressed(fib_trie) is addressed


@pytest.mark.parametrize(
    ("status", "stderr", "said"),
    [
        (
            1,
            b"bwrap: loopback: Failed RTM_NEWADDR: File exists\n",
            "bwrap exited with status 1: bwrap: loopback: Failed RTM_NEWADDR: File exists",
        ),
        (-9, b"", "bwrap was killed by signal 9: nothing on stderr"),
        (None, b"a\nb\nc\nd\n", "bwrap was still running: b / c / d"),
    ],
)
def test_sandbox_failure(status: int | None, stderr: bytes, said: str) -> None:
    assert sandbox_failure("it ended", status, stderr) == f"it ended; {said}"


def test_with_network_shows_a_resolver_over_the_root_bind() -> None:
    argv = ["/usr/bin/bwrap", "--ro-bind", "/", "/", "--chdir", "/w", "--", "sh"]
    resolver = ("/run/systemd/resolve/resolv.conf", "/run/systemd/resolve/stub-resolv.conf")
    assert with_network(argv, 5, 6, resolver) == [
        "/usr/bin/bwrap", "--unshare-net", "--info-fd", "5", "--block-fd", "6",
        "--ro-bind", "/", "/",
        "--ro-bind", "/run/systemd/resolve/resolv.conf", "/run/systemd/resolve/stub-resolv.conf",
        "--chdir", "/w", "--", "sh",
    ]  # fmt: skip


STUB = "# systemd-resolved stub\nnameserver 127.0.0.53\noptions edns0 trust-ad\nsearch lan\n"
UPSTREAM = "nameserver 192.168.1.1\nnameserver fe80::1%eth0\nsearch lan\n"


@pytest.mark.parametrize(
    ("host", "upstream", "replace"),
    [
        (STUB, UPSTREAM, True),  # systemd-resolved's stub: show its upstream servers
        (STUB, None, False),  # no upstream list: nothing better to show
        (STUB, "nameserver 127.0.0.1\n", False),  # upstream on loopback too
        ("nameserver 10.255.255.53\n", UPSTREAM, False),  # reachable as it is
        ("nameserver 127.0.0.53\nnameserver 9.9.9.9\n", UPSTREAM, False),  # one reachable
        ("nameserver ::1\n", UPSTREAM, True),
        ("", UPSTREAM, False),  # no nameserver: the libc default, leave it
    ],
)
def test_resolver_for_sandbox(host: str, upstream: str | None, replace: bool) -> None:
    assert resolver_for_sandbox(host, upstream) is replace


def test_nameservers() -> None:
    assert nameservers(STUB + UPSTREAM + "nameserver\n#nameserver 1.1.1.1\n") == [
        "127.0.0.53",
        "192.168.1.1",
        "fe80::1%eth0",
    ]


# /proc/net/fib_trie of a host with eth0 192.0.2.2/24, docker0 172.17.0.1/16 and an
# AnyIP route `local 198.51.100.0/24 dev lo`; both tables list the LOCAL entries.
HOST_FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     |-- 172.17.0.1
        /32 host LOCAL
     +-- 192.0.2.0/24 2 0 2
        +-- 192.0.2.0/30 2 0 2
           |-- 192.0.2.0
              /24 link UNICAST
           |-- 192.0.2.2
              /32 host LOCAL
        |-- 192.0.2.255
           /32 link BROADCAST
     |-- 198.51.100.0
        /24 host LOCAL
     |-- 198.51.100.7
        /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 5
     |-- 192.0.2.2
        /32 host LOCAL
"""

IF_INET6 = """fe8000000000000000fc00fffe000001 04 40 20 80     eth0
00000000000000000000000000000001 01 80 10 80       lo
fd000000000000000000000000000002 04 40 00 82     eth0
garbage
"""


def test_local_networks_are_the_hosts_own_without_loopback() -> None:
    assert [str(n) for n in local_networks(HOST_FIB_TRIE)] == [
        "172.17.0.1/32",
        "192.0.2.2/32",
        "198.51.100.0/24",  # the /32 inside it collapses into it (nft refuses overlaps)
    ]
    assert local_networks("") == []


def test_inet6_addresses_without_loopback() -> None:
    assert [str(a) for a in inet6_addresses(IF_INET6)] == ["fd00::2", "fe80::fc:ff:fe00:1"]


def test_firewall_ruleset_refuses_the_host_and_the_gateways_and_caps_tcp() -> None:
    host4 = local_networks(HOST_FIB_TRIE)
    ruleset = firewall_ruleset(host4, inet6_addresses(IF_INET6), 256, egress=OPEN)
    v4 = "{ 10.0.2.2/32, 172.17.0.1/32, 192.0.2.2/32, 198.51.100.0/24 }"
    v6 = "{ fd00::2/128, fd63:7265:7700::2/128, fe80::fc:ff:fe00:1/128 }"
    assert f"ip daddr {v4} meta l4proto {{ tcp, udp }} jump refuse" in ruleset
    assert f"ip6 daddr {v6} meta l4proto {{ tcp, udp }} jump refuse" in ruleset
    # ICMPv6 passes: neighbour probes go to the gateway's address (IPv6 stalled without).
    assert "icmp" not in ruleset
    assert "ct status & confirmed == 0 ct count over 256 reject with tcp reset" in ruleset
    assert "127.0.0" not in ruleset and "::1/" not in ruleset  # the sandbox's own loopback
    # What is refused is counted first (the denials), then rejected.
    assert "update @denied4 { ip daddr . meta l4proto . th dport }" in ruleset
    # No host address at all (a machine with loopback only): the gateways still go in.
    bare = firewall_ruleset([], [], 8)
    assert "ip daddr { 10.0.2.2/32 }" in bare and "ip6 daddr { fd63:7265:7700::2/128 }" in bare
    assert "ct count over 8 " in bare
    assert "dport 53" not in ruleset
    # Without forwarded ports the whole own loopback is not counted, first thing.
    assert ruleset.splitlines()[3] == '    oifname "lo" accept'


def test_the_cap_counts_the_forwarded_ports_on_loopback() -> None:
    """The own loopback is uncounted (an agent's test server) except pasta's listeners."""
    ruleset = firewall_ruleset([], [], 64, forwarded=[11434, 8080, 8080])
    assert ruleset.splitlines()[3] == '    oifname "lo" tcp dport != { 8080, 11434 } accept'


def test_a_resolver_on_a_host_address_keeps_its_port_53() -> None:
    """A dnsmasq on the host's LAN address named in resolv.conf: DNS works, nothing else there."""
    resolvers = ["192.0.2.2", "fd00::2", "127.0.0.53", "fe80::1%eth0", "bogus"]
    ruleset = firewall_ruleset(local_networks(HOST_FIB_TRIE), [], 256, resolvers)
    lines = ruleset.splitlines()
    allow4 = "    ip daddr 192.0.2.2 meta l4proto { tcp, udp } th dport 53 accept"
    allow6 = "    ip6 daddr fd00::2 meta l4proto { tcp, udp } th dport 53 accept"
    assert allow4 in lines and allow6 in lines
    assert lines.index(allow4) < next(i for i, x in enumerate(lines) if "reject" in x)
    assert ruleset.count("dport 53") == 2  # not for loopback, scoped or malformed entries


def test_helper_argv_passes_the_channel_and_the_library() -> None:
    """The namespaces come later, over the channel (`NftHelper.enter`): a spare waits in none."""
    argv = helper_argv("/usr/bin/python3", 8, "/usr/lib/libnftables.so.1")
    assert argv[:4] == ["/usr/bin/python3", "-I", "-S", "-c"]
    assert argv[5:] == ["8", "/usr/lib/libnftables.so.1"]


def test_the_default_plan_caps_at_256() -> None:
    assert NetworkPlan().max_connections == 256


def test_no_libnftables_is_said_in_the_health() -> None:
    assert health_note(LinuxMode.HYBRID, 7, firewall=True) is None
    note = health_note(LinuxMode.HYBRID, 7, firewall=False)
    assert note == NO_FIREWALL_NOTE and "install nftables" in note
    assert "0.0.0.0" in note and "connection cap" in note
