"""Linux: each sandbox gets its own network namespace, connected outwards by `pasta`.

Why (issue 12, escape 4): in the host's network namespace an agent could
bind the crew server's port on 127.0.0.1 while the server restarts and
receive the Computer's bearer token, listen on 0.0.0.0 for the whole LAN,
read `/proc/net/tcp` of the host, reach host abstract Unix sockets and every
service that listens on the host's loopback.

How: bwrap gets `--unshare-net` (its own loopback, nothing else), writes the
sandbox's pid on `--info-fd` and holds the sandbox on `--block-fd`; the
launcher then attaches pasta (Debian package `passt`) to that pid and only
releases the sandbox once the network is up, so the engine never starts
without it. pasta is started by the launcher, in its own session, with
`PR_SET_PDEATHSIG` (through `setpriv`, so it dies with the launcher) and is
killed when the run ends (`SandboxNetwork.close`).

The order matters. bwrap's child, once bwrap has written the pid, gives `lo`
its 127.0.0.1 itself (RTM_NEWADDR with NLM_F_EXCL) and dies when that fails;
pasta brings `lo` up, which makes the kernel add that very address. So pasta
starts only once the namespace shows 127.0.0.1 (`loopback_addressed`): on a
loaded machine the child can wait for the CPU longer than pasta needs, and
the sandbox then died with "bwrap: loopback: Failed RTM_NEWADDR" (seen as a
pasta that "never configured the interface", and as ENOENT on
`/proc/<pid>/ns/net` when that pasta was started again). A pidfd of the
child tells a sandbox that ended from a pasta still at work; the caller then
reports bwrap's status and stderr (`sandbox_failure`).

pasta's options, checked against Debian 12's pasta (2023-03):

- `-t none -u none`: nothing from the host reaches the sandbox (the default,
  `auto`, would forward every port the agent binds). `-t 127.0.0.1/H:P` for
  an explicit inbound publish only.
- `-T PORTS -U none`: exactly the named host-loopback TCP ports are spliced
  from the sandbox's 127.0.0.1 to the host's (the default, `auto`, would
  forward every port bound on the host).
- `--no-map-gw`: the gateway address does not lead to the host's loopback
  (by default it reaches *every* host port).
- `-a/-n/-g`: the sandbox's own addresses (a private 10.0.2.0/24 as slirp's,
  and a ULA for IPv6). pasta's default copies the host's address, which
  makes the host's own non-loopback address unreachable from the sandbox.
- DNS: the sandbox reads the host's resolv.conf. When that names only a
  resolver on the host's loopback (systemd-resolved's 127.0.0.53), which is
  out of reach inside (and pasta 2023-03 splices forwarded ports to the
  host's 127.0.0.1 only), the sandbox is shown systemd-resolved's list of
  upstream servers in its place (`sandbox_resolver`).
- `--config-net`: pasta configures the interface itself (nobody runs DHCP
  inside); `-f -q`: a foreground child of ours, quiet.
- `--runas 0` when the launcher is root: pasta would otherwise drop to
  `nobody` before it opens the sandbox's user namespace, which a root-owned
  namespace refuses. pasta still drops every capability and confines itself
  (its own mount namespace and seccomp filter) once the namespace is set up.

The sandbox's own firewall (issue 20, items 4 and 5), an nftables table in
its network namespace, set by the launcher after pasta is up and before the
sandbox is let go (the agent has no capability in that namespace to change it):

- The host's own addresses are refused. pasta answers a connection to any
  address outside with a host socket's `connect()`: to the host's own
  non-loopback addresses (eth0's, docker0's, its IPv6 ones) that reaches every
  service bound to `0.0.0.0`/`::` on the host (an Ollama with
  `OLLAMA_HOST=0.0.0.0`, `docker -p` ports). Every address the host's kernel
  calls local (`/proc/net/fib_trie` LOCAL entries, `/proc/net/if_inet6`),
  read at each attach, and pasta's gateway addresses (which lead nowhere with
  `--no-map-gw`), are rejected; loopback is the sandbox's own (the forwarded
  ports go through pasta's listeners there). An address the host gains after
  the attach (a warm server lives on) is not covered until the next attach.
- At most `NetworkPlan.max_connections` TCP connections at a time (`ct count`,
  a conntrack count of the namespace: the spliced ones to forwarded loopback
  ports as well as the ones outwards); past it a connect is refused (RST).
  Closed connections stop counting at once (TIME_WAIT is not counted).

- The agent's egress policy (issue 23, `crew_common.egress`, `NetworkPlan.egress`,
  `public` unless told): `open` adds nothing; `public` refuses TCP and UDP to
  every range of `not_public_networks()` (IPv4-mapped included) off the
  sandbox's own loopback, the resolv.conf nameservers' port 53 excepted as
  above; `allow` accepts, after the cap, only the forwarded loopback ports,
  each listed range as written and the addresses the launcher's resolver put
  into the `allowed*` sets (`egress_dns`), and refuses all other TCP and UDP
  (pings dropped); `none` only the forwarded loopback ports. `allow` and
  `none` reach no nameserver outside: their resolv.conf names 127.0.0.1, where
  pasta (`-U 53:PORT`) forwards UDP to that sandbox's resolver on the host's
  loopback. Established connections pass first in those two modes, so an
  address leaving a set (its TTL) ends no connection.
- Every refusal jumps to the `refuse` chain, which adds (address, protocol,
  port) to the `denied4`/`denied6` sets (dynamic, a counter per element)
  before it rejects: the kernel summarises, `denials` reads the counts. Works
  in a user-owned namespace as root and unprivileged (no NFLOG, no netlink
  listener). Cap refusals are not denials of the policy and are not counted.

nftables is driven through libnftables (`ctypes`) by one long-lived Python
child per sandbox (`nft_helper`) that enters the namespaces with `setns`
itself: `nsenter` + `nft` would not do, an exec as a non-root uid drops the
capabilities the user namespace gives. Without libnftables (Debian package
libnftables1, from nftables) only egress mode `open` runs, without that
firewall, and the backend's health says so (`NO_FIREWALL_NOTE`); any other
mode is refused before the sandbox starts (`egress_refusal`: fail closed).
With it, a firewall that cannot be set fails the attach.

Everything pure here (`pasta_argv`, `with_network`, `child_pid`,
`listening_ports`, `has_default_route`, `loopback_addressed`,
`sandbox_failure`, `local_networks`, `inet6_addresses`, `firewall_ruleset`,
`egress_refusal`, `udp_bound`) is table-tested; `SandboxNetwork` is the one place that starts and stops pasta.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import select
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO

import anyio

from crew_common.egress import EgressPolicy, not_public_networks
from sandbox_launcher.denials import DENIED_SETS, Denial, DenialLog, merge_counts
from sandbox_launcher.egress_dns import EgressResolver, SetFiller, ask_upstream
from sandbox_launcher.limits import DEFAULT_MAX_CONNECTIONS
from sandbox_launcher.nft_helper import NftError, NftHelper, NftSpare

log = logging.getLogger(__name__)

PASTA_CANDIDATES = ("/usr/bin/pasta", "/usr/local/bin/pasta")
SETPRIV_CANDIDATES = ("/usr/bin/setpriv", "/bin/setpriv")
INSTALL_HINT = "install passt (Debian/Ubuntu: apt install passt; Fedora: dnf install passt)"
SANDBOX_IPV4 = ("10.0.2.100", "24", "10.0.2.2")  # address, prefix, gateway (as slirp4netns)
SANDBOX_IPV6 = ("fd63:7265:7700::100", "fd63:7265:7700::2")  # address, gateway ("crew" ULA)
NS_GET_USERNS = 0xB701  # ioctl on a namespace fd: the user namespace that owns it
READY_TIMEOUT_S = 10.0
READY_POLL_S = 0.002
MAX_FORWARDED_PORTS = 32
FIREWALL_TIMEOUT_S = 10.0
NFT_TABLE = "crew_sandbox"
OPEN = EgressPolicy(mode="open")
PUBLIC = EgressPolicy()  # the default: fail safe
NO_FIREWALL_NOTE = (
    "libnftables not found: sandboxes reach services bound to 0.0.0.0 on this machine's "
    "own addresses and have no connection cap, and only agents with egress mode 'open' "
    "can run (install nftables; Debian/Ubuntu: apt install "
    "nftables, Fedora: dnf install nftables)"
)
_TCP_LISTEN = "0A"
_LOOPBACK_V4 = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it (little-endian hex)


class NetworkUnavailable(OSError):
    """The sandbox's network could not be set up; the run does not start."""


class SandboxExited(NetworkUnavailable):
    """The sandbox's process ended before its network was up: bwrap's stderr says why."""


@dataclass(frozen=True)
class NetworkPlan:
    """What one sandbox's network lets through.

    `loopback_ports`: host-loopback TCP ports the sandbox reaches at its own
    127.0.0.1 (the crew server, a local model). `publish`: (ns port, host
    port) made reachable on the host's 127.0.0.1 only (an engine server).
    """

    loopback_ports: tuple[int, ...] = ()
    publish: tuple[int, int] | None = None
    # TCP connections the sandbox may hold at a time (the bootstrap's
    # turn_limits.max_connections): one agent cannot exhaust pasta or a port.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # Where the sandbox may connect (crew_common.egress); `public` unless told.
    egress: EgressPolicy = PUBLIC


@dataclass(frozen=True)
class PastaTools:
    """Absolute paths of pasta, `setpriv` (for the parent-death signal) and libnftables.

    `nftables` None: no firewall in the sandbox's namespace (`NO_FIREWALL_NOTE`).
    """

    pasta: str
    setpriv: str
    nftables: str | None = None


def _first_executable(candidates: Sequence[str]) -> str | None:
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def find_pasta() -> PastaTools | None:
    """pasta and setpriv at their fixed places (never through PATH), or None when missing."""
    pasta = _first_executable(PASTA_CANDIDATES)
    setpriv = _first_executable(SETPRIV_CANDIDATES)
    if pasta is None or setpriv is None:
        return None
    return PastaTools(pasta, setpriv, find_nftables())


def nftables_candidates() -> list[str]:
    """Where libnftables may be: the multiarch directory (Debian), lib64 (Fedora), lib."""
    dirs = []
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch:
        dirs += [f"/usr/lib/{multiarch}", f"/lib/{multiarch}"]
    dirs += ["/usr/lib64", "/usr/lib"]
    return [f"{d}/libnftables.so.1" for d in dirs]


def find_nftables() -> str | None:
    """libnftables at its fixed places, or None (the sandbox then has no firewall)."""
    for candidate in nftables_candidates():
        if os.path.isfile(candidate):
            return candidate
    return None


def missing_reason() -> str:
    """What a user reads when pasta (or setpriv) is missing."""
    return f"pasta not found (looked in {', '.join(PASTA_CANDIDATES)}); {INSTALL_HINT}"


def _port_spec(ports: Sequence[int]) -> str:
    return ",".join(str(p) for p in sorted(set(ports))) if ports else "none"


def pasta_argv(
    tools: PastaTools,
    ns_fds: tuple[int | None, int],
    plan: NetworkPlan,
    as_root: bool,
    dns_port: int | None = None,
) -> list[str]:
    """The argv that attaches pasta to a sandbox's namespaces, given as fds (user, net). Pure.

    No user fd: the network namespace is owned by pasta's own user namespace (a
    root launcher's sandboxes have none of their own), which pasta cannot re-enter.
    `dns_port`: the launcher's resolver for this sandbox, on the host's loopback,
    reached at the sandbox's own 127.0.0.1:53 (UDP).
    """
    address4, prefix4, gateway4 = SANDBOX_IPV4
    address6, gateway6 = SANDBOX_IPV6
    argv = [tools.setpriv, "--pdeathsig", "KILL", "--", tools.pasta, "-f", "-q"]
    argv += ["--config-net", "--no-map-gw"]
    argv += ["-a", address4, "-n", prefix4, "-g", gateway4, "-a", address6, "-g", gateway6]
    inbound = "none"
    if plan.publish is not None:
        inside, host = plan.publish
        inbound = f"127.0.0.1/{host}:{inside}"
    udp = f"53:{dns_port}" if dns_port is not None else "none"
    argv += ["-t", inbound, "-u", "none", "-T", _port_spec(plan.loopback_ports), "-U", udp]
    if as_root:
        argv += ["--runas", "0"]
    user_fd, net_fd = ns_fds
    # We stop pasta ourselves: it need not watch the namespace (its path is an fd of its own).
    argv += ["--no-netns-quit"]
    if user_fd is not None:
        argv += ["--userns", f"/proc/self/fd/{user_fd}"]
    return [*argv, "--netns", f"/proc/self/fd/{net_fd}"]


def with_network(
    argv: list[str], info_fd: int, block_fd: int, resolver: tuple[str, str] | None = None
) -> list[str]:
    """`argv` (a bwrap argv) with its own network namespace and the two sync fds. Pure.

    The options go right after the bwrap program, before its other options;
    `resolver` (source, destination), a resolv.conf to show instead of the
    host's, goes with the last mounts (before `--chdir`), over `--ro-bind / /`.
    """
    for index, word in enumerate(argv):
        if os.path.basename(word) == "bwrap":
            sync = ["--unshare-net", "--info-fd", str(info_fd), "--block-fd", str(block_fd)]
            argv = [*argv[: index + 1], *sync, *argv[index + 1 :]]
            if resolver is not None:
                at = argv.index("--chdir")
                argv = [*argv[:at], "--ro-bind", *resolver, *argv[at:]]
            return argv
    raise ValueError("not a bwrap argv: no bwrap program in it")


HOST_RESOLV_CONF = "/etc/resolv.conf"
# systemd-resolved's list of the upstream servers, next to its loopback stub.
RESOLVED_UPSTREAM = "/run/systemd/resolve/resolv.conf"


def nameservers(resolv_conf: str) -> list[str]:
    """The `nameserver` addresses of a resolv.conf text. Pure."""
    found = []
    for line in resolv_conf.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            found.append(words[1])
    return found


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def resolver_for_sandbox(host_conf: str, upstream_conf: str | None) -> bool:
    """Should the sandbox see the upstream list instead of the host's resolv.conf? Pure.

    Yes when every nameserver of the host's is on its loopback (a stub such as
    systemd-resolved's 127.0.0.53, out of reach in the sandbox's own network)
    and the upstream list names one that is not.
    """
    host = nameservers(host_conf)
    if not host or not all(_is_loopback(a) for a in host) or upstream_conf is None:
        return False
    return any(not _is_loopback(a) for a in nameservers(upstream_conf))


def sandbox_resolver() -> tuple[str, str] | None:
    """(upstream resolv.conf, where the host's really is) when the sandbox needs it, else None."""
    target = os.path.realpath(HOST_RESOLV_CONF)
    upstream = os.path.realpath(RESOLVED_UPSTREAM)
    if upstream == target:
        return None
    try:
        with open(target) as f:
            host = f.read(64 * 1024)
    except OSError:
        return None
    try:
        with open(upstream) as f:
            upstream_text: str | None = f.read(64 * 1024)
    except OSError:
        upstream_text = None
    return (upstream, target) if resolver_for_sandbox(host, upstream_text) else None


def child_pid(info: bytes) -> int | None:
    """The sandbox's pid from bwrap's `--info-fd` JSON, or None while it is incomplete."""
    try:
        data = json.loads(info)
    except ValueError:
        return None
    pid = data.get("child-pid") if isinstance(data, dict) else None
    return pid if isinstance(pid, int) and pid > 0 else None


def sandbox_failure(reason: str, status: int | None, stderr: bytes) -> str:
    """`reason`, how bwrap ended and the end of what it wrote (its own error line). Pure.

    `status` as `Popen.returncode`: negative for a signal, None while it runs.
    """
    if status is None:
        ended = "bwrap was still running"
    elif status < 0:
        ended = f"bwrap was killed by signal {-status}"
    else:
        ended = f"bwrap exited with status {status}"
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    said = " / ".join(lines[-3:])[-500:] if lines else "nothing on stderr"
    return f"{reason}; {ended}: {said}"


def listening_ports(proc_net_tcp: str, address: str = _LOOPBACK_V4) -> set[int]:
    """TCP ports in LISTEN on `address` in a `/proc/<pid>/net/tcp` text. Pure."""
    ports = set()
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != _TCP_LISTEN:
            continue
        host, _, port = fields[1].partition(":")
        if host == address:
            ports.add(int(port, 16))
    return ports


def udp_bound(proc_net_udp: str, port: int, address: str = _LOOPBACK_V4) -> bool:
    """Is a UDP socket bound to `address`:`port` in a `/proc/<pid>/net/udp` text? Pure."""
    wanted = f"{address}:{port:04X}"
    return any(
        len(fields) > 1 and fields[1] == wanted
        for fields in (line.split() for line in proc_net_udp.splitlines()[1:])
    )


def loopback_addressed(fib_trie: str) -> bool:
    """Does a `/proc/<pid>/net/fib_trie` text hold 127.0.0.1 (bwrap's loopback step done)? Pure."""
    return any(line.strip() == "|-- 127.0.0.1" for line in fib_trie.splitlines())


def has_default_route(proc_net_route: str) -> bool:
    """Does a `/proc/<pid>/net/route` text have an IPv4 default route? Pure."""
    for line in proc_net_route.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return True
    return False


def local_networks(fib_trie: str) -> list[ipaddress.IPv4Network]:
    """The host's own IPv4 addresses (LOCAL entries) of a `/proc/net/fib_trie`, collapsed. Pure.

    Loopback is left out: inside, 127.0.0.0/8 is the sandbox's own.
    """
    found: set[ipaddress.IPv4Network] = set()
    address = None
    for line in fib_trie.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] in ("|--", "+--"):
            address = words[1].split("/")[0]
        elif len(words) == 3 and words[0].startswith("/") and words[2] == "LOCAL" and address:
            try:
                network = ipaddress.IPv4Network(f"{address}{words[0]}", strict=False)
            except ValueError:
                continue
            if not network.is_loopback:
                found.add(network)
    return list(ipaddress.collapse_addresses(found))


def inet6_addresses(if_inet6: str) -> list[ipaddress.IPv6Address]:
    """The host's own IPv6 addresses of a `/proc/net/if_inet6` text, without ::1. Pure."""
    found = set()
    for line in if_inet6.splitlines():
        words = line.split()
        if not words or len(words[0]) != 32:
            continue
        try:
            address = ipaddress.IPv6Address(int(words[0], 16))
        except ValueError:
            continue
        if not address.is_loopback:
            found.add(address)
    return sorted(found)


def firewall_ruleset(
    host4: Sequence[ipaddress.IPv4Network],
    host6: Sequence[ipaddress.IPv6Address],
    max_connections: int,
    resolvers: Sequence[str] = (),
    forwarded: Sequence[int] = (),
    egress: EgressPolicy = OPEN,
) -> str:
    """The nftables table of a sandbox's namespace: no host address, a TCP connection cap,
    and the `egress` policy's refusals. Pure.

    The cap counts what goes through pasta: connections out of the sandbox's
    interface and those to the `forwarded` loopback ports (pasta's listeners).
    The sandbox's own loopback otherwise (a test server of the agent's, pasta's
    inbound connections to a published port: the Computer's to a warm server,
    the launcher's resolver for `allow` and `none`) is not counted.

    pasta's gateway addresses are refused too: with `--no-map-gw` they lead
    nowhere, and a host that has one of them as its own would be reached.
    TCP and UDP only (all pasta carries to a host socket besides pings): ICMPv6
    must pass, the kernel's neighbour probes go to the gateway's own address.
    `resolvers`: the nameservers of the sandbox's resolv.conf; their port 53
    stays reachable when one is the host's own (a dnsmasq on its LAN address)
    or on the LAN (`public`). `allow` and `none` reach no nameserver outside:
    their DNS is the launcher's resolver on the sandbox's own 127.0.0.1:53.

    Every refusal goes through the `refuse` chain, which counts it in the
    `denied4`/`denied6` sets (one element per address, protocol and port,
    with a counter: what `denials` reads) before it rejects.
    """
    v4 = {*host4, ipaddress.IPv4Network(f"{SANDBOX_IPV4[2]}/32")}
    v6 = {ipaddress.IPv6Network(a) for a in [*host6, ipaddress.IPv6Address(SANDBOX_IPV6[1])]}
    set4 = _nft_set(v4)
    set6 = _nft_set(v6)
    dns = ""
    if egress.mode in ("open", "public"):
        for address in sorted(
            {a for a in map(_address, resolvers) if a and not a.is_loopback}, key=str
        ):
            family = "ip" if address.version == 4 else "ip6"
            dns += f"    {family} daddr {address} meta l4proto {{ tcp, udp }} th dport 53 accept\n"
    ports = ", ".join(str(p) for p in sorted(set(forwarded)))
    own_loopback = f'oifname "lo" tcp dport != {{ {ports} }}' if ports else 'oifname "lo"'
    refused = ""
    if egress.mode == "public":
        not_public = not_public_networks()
        public4 = _nft_set(n for n in not_public if n.version == 4)
        public6 = _nft_set(n for n in not_public if n.version == 6)
        # Not on `lo`: the forwarded ports are the sandbox's own 127.0.0.1 (pasta's listeners).
        refused = (
            f'    oifname != "lo" ip daddr {{ {public4} }} meta l4proto {{ tcp, udp }} jump refuse\n'
            f'    oifname != "lo" ip6 daddr {{ {public6} }} meta l4proto {{ tcp, udp }} jump refuse\n'
        )
    closed = ""
    if egress.mode in ("allow", "none"):
        # Established ones first: a name's addresses leaving the set (its TTL) end no
        # connection opened while they were in it.
        closed = (
            '    oifname "lo" accept\n'
            + _allowed_rules(egress)
            + (
                "    meta l4proto { tcp, udp } jump refuse\n"
                # Pings carry data too (pasta sends them on from a host socket).
                "    icmp type echo-request drop\n"
                "    icmpv6 type echo-request drop\n"
            )
        )
        own_loopback = "ct state established,related accept\n    " + own_loopback
    return (
        f"table inet {NFT_TABLE} {{\n"
        "  chain output {\n"
        "    type filter hook output priority 0; policy accept;\n"
        f"    {own_loopback} accept\n"
        f"{dns}"
        f"    ip daddr {{ {set4} }} meta l4proto {{ tcp, udp }} jump refuse\n"
        f"    ip6 daddr {{ {set6} }} meta l4proto {{ tcp, udp }} jump refuse\n"
        f"{refused}"
        # Only a connection's first SYN (its conntrack entry not confirmed yet) is counted:
        # on a retransmitted one (pasta answers once its host connect is done) this
        # kernel's `ct count` fails, and a failing `ct count` drops the packet.
        "    meta l4proto tcp ct state new ct status & confirmed == 0 "
        f"ct count over {max_connections} reject with tcp reset\n"
        f"{closed}"
        "  }\n"
        "  chain refuse {\n"
        "    meta nfproto ipv4 update @denied4 { ip daddr . meta l4proto . th dport }\n"
        "    meta nfproto ipv6 update @denied6 { ip6 daddr . meta l4proto . th dport }\n"
        "    meta l4proto tcp reject with tcp reset\n"
        "    reject\n"
        "  }\n"
        f"{_sets(egress)}"
        "}\n"
    )


# One element per refused (address, protocol, port), with its counter; full at
# DENIED_SET_SIZE (a refusal past it is still refused, just not recorded).
DENIED_SET_SIZE = 4096


def _sets(egress: EgressPolicy) -> str:
    sets = ""
    for name, kind in (("denied4", "ipv4_addr"), ("denied6", "ipv6_addr")):
        sets += (
            f"  set {name} {{ type {kind} . inet_proto . inet_service; flags dynamic; "
            f"counter; size {DENIED_SET_SIZE}; }}\n"
        )
    if egress.mode == "allow":
        # The addresses the launcher's resolver answered for an allowed name, until its TTL.
        for name, kind in ALLOWED_SETS.items():
            sets += f"  set {name} {{ type {kind}; flags timeout; }}\n"
    return sets


# The sets `egress_dns` fills: with a port (a rule `name:443`) and without (every port).
ALLOWED_SETS = {
    "allowed4": "ipv4_addr . inet_service",
    "allowed6": "ipv6_addr . inet_service",
    "allowed4_all": "ipv4_addr",
    "allowed6_all": "ipv6_addr",
}


def _allowed_rules(egress: EgressPolicy) -> str:
    """`allow`'s accepts: each listed range as written, then the resolver's sets."""
    if egress.mode != "allow":
        return ""
    rules = ""
    for rule in egress.rules:
        if rule.network is None:
            continue
        family = "ip6" if ":" in rule.network else "ip"
        port = f" th dport {rule.port}" if rule.port is not None else ""
        rules += f"    {family} daddr {rule.network} meta l4proto {{ tcp, udp }}{port} accept\n"
    if any(rule.host is not None for rule in egress.rules):
        rules += (
            "    meta l4proto { tcp, udp } ip daddr . th dport @allowed4 accept\n"
            "    meta l4proto { tcp, udp } ip6 daddr . th dport @allowed6 accept\n"
            "    meta l4proto { tcp, udp } ip daddr @allowed4_all accept\n"
            "    meta l4proto { tcp, udp } ip6 daddr @allowed6_all accept\n"
        )
    return rules


def _nft_set(networks: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> str:
    """One family's networks as an nft set's elements, collapsed (nft refuses overlaps)."""
    collapsed: Iterable[object] = ipaddress.collapse_addresses(list(networks))  # type: ignore[type-var]
    return ", ".join(str(n) for n in collapsed)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None  # a malformed nameserver: no exception for it
    # A link-local one (fe80::1%eth0) is no host address that pasta would reach.
    return None if address.is_link_local else address


def host_ruleset(plan: NetworkPlan, resolv_conf: str) -> str:
    """`firewall_ruleset` for this host's addresses now and the sandbox's resolv.conf path."""
    return firewall_ruleset(
        local_networks(_read("/proc/self/net/fib_trie")),
        inet6_addresses(_read("/proc/self/net/if_inet6")),
        plan.max_connections,
        nameservers(_read(resolv_conf)),
        plan.loopback_ports,
        plan.egress,
    )


def egress_refusal(tools: PastaTools, egress: EgressPolicy) -> str | None:
    """Why a sandbox with `egress` cannot start here (fail closed), or None. Pure."""
    if egress.mode == "open" or tools.nftables is not None:
        return None
    return (
        f"egress mode {egress.mode!r} needs the sandbox's firewall, and libnftables was not "
        "found: only mode 'open' can run here (install nftables; Debian/Ubuntu: apt install "
        "nftables, Fedora: dnf install nftables)"
    )


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


class SandboxNetwork:
    """The network of one sandbox: bwrap's sync pipes and the pasta process.

    Use: `argv(bwrap_argv)` and `pass_fds` for the spawn, `spawned()` right
    after it, then `attach()` (async) or `attach_blocking()`, and always
    `close()`; the engine starts only after a successful attach.
    """

    def __init__(
        self,
        tools: PastaTools,
        plan: NetworkPlan,
        resolver: tuple[str, str] | None = None,
        spare: NftSpare | None = None,
    ) -> None:
        self.tools = tools
        self.plan = plan
        self.resolver = resolver  # (source, destination) of a resolv.conf to show inside
        self._info_r, self._info_w = os.pipe()
        self._block_r, self._block_w = os.pipe()
        self._info = b""
        self._child: int | None = None  # a pidfd of the sandbox's process, once bwrap named it
        self._waiting_for = "bwrap to start the sandbox"
        self._pasta: subprocess.Popen[bytes] | None = None
        self._pasta_log: IO[bytes] | None = None
        self._nft: NftHelper | None = None  # once the firewall is set
        # The firewall's helper, started now (or taken ready from `spare`): its Python
        # start runs while bwrap and pasta start, not after them.
        self._helper: NftHelper | None = None
        self._spare = spare
        self._firewall_error: BaseException | None = None
        if tools.nftables is not None:
            try:
                self._helper = (
                    spare.take() if spare else NftHelper.spawn(sys.executable, tools.nftables)
                )
            except NftError as exc:
                log.warning("the nftables helper did not start ahead: %s", exc)  # retried
        self.denial_log = DenialLog()
        self._filler: SetFiller | None = None
        self._dns: EgressResolver | None = None
        self._dns_conf: str | None = None
        if plan.egress.mode in ("allow", "none") and tools.nftables is not None:
            self._start_resolver()

    def _start_resolver(self) -> None:
        """`allow` and `none`: the sandbox's DNS is ours (`egress_dns`), named in its resolv.conf."""
        upstream = nameservers(_read(HOST_RESOLV_CONF)) or ["127.0.0.1"]
        self._dns = EgressResolver(
            self.plan.egress,
            ask_upstream(upstream),
            self._allow_addresses,
            self.denial_log.refused_name,
            self.denial_log.name_address,
        )
        fd, self._dns_conf = tempfile.mkstemp(prefix="crew-resolv-", suffix=".conf")
        with os.fdopen(fd, "w") as f:
            f.write("nameserver 127.0.0.1\noptions timeout:2 attempts:2\n")
        os.chmod(self._dns_conf, 0o644)
        self.resolver = (self._dns_conf, os.path.realpath(HOST_RESOLV_CONF))

    def _allow_addresses(self, elements: list[tuple[str, str]], ttl: int) -> None:
        if self._filler is None:
            raise NftError("the sandbox's firewall is not set")
        self._filler.allow(elements, ttl)

    @property
    def pass_fds(self) -> tuple[int, int]:
        """The fds bwrap inherits: it writes to the first and waits on the second."""
        return (self._info_w, self._block_r)

    def argv(self, bwrap_argv: list[str]) -> list[str]:
        """The sandbox's argv with its own network namespace (and a reachable resolver)."""
        return with_network(bwrap_argv, self._info_w, self._block_r, self.resolver)

    def spawned(self) -> None:
        """Close our copies of bwrap's ends (call once the sandbox is started)."""
        for fd in (self._info_w, self._block_r):
            _close(fd)
        self._info_w = self._block_r = -1

    def _read_info(self) -> int | None:
        """Read what bwrap wrote so far; the pid once complete. EOF without one: bwrap failed."""
        chunk = os.read(self._info_r, 4096)
        if not chunk:
            raise SandboxExited("bwrap ended before it started the sandbox")
        self._info += chunk
        pid = child_pid(self._info)
        if pid is not None:
            self._hold_child(pid)
        return pid

    def _hold_child(self, pid: int) -> None:
        """Hold a pidfd of the sandbox: it says when that very process ends (not a pid reuser)."""
        try:
            self._child = os.pidfd_open(pid)
        except ProcessLookupError:
            raise self._child_gone(pid) from None

    def _child_gone(self, pid: int) -> SandboxExited:
        return SandboxExited(
            f"the sandbox's process (pid {pid}) ended before its network was attached"
        )

    def _child_exited(self) -> bool:
        """Has the sandbox's process ended (its pidfd turns readable)?"""
        if self._child is None:
            return False
        # poll, not select: a busy launcher's fds go past select's 1024.
        poller = select.poll()
        poller.register(self._child, select.POLLIN)
        return bool(poller.poll(0))

    def _networkable(self, pid: int) -> bool:
        """Has bwrap's child set up the namespace's loopback, so that pasta may go in?

        bwrap's child adds 127.0.0.1/8 to `lo` itself, with NLM_F_EXCL, and dies
        when that fails ("loopback: Failed RTM_NEWADDR"). pasta brings `lo` up,
        and the kernel then gives it that very address: a pasta that gets there
        first (a loaded machine that lets the child wait) kills the sandbox.
        """
        if self._child_exited():
            raise self._child_gone(pid)
        self._waiting_for = "bwrap to set up the sandbox's loopback"
        return loopback_addressed(_read(f"/proc/{pid}/net/fib_trie"))

    def _namespace_fds(self, pid: int) -> tuple[int, int]:
        """(user, net) namespace fds of the sandbox: the caller closes both.

        bwrap (unprivileged) nests a second user namespace inside the first, so
        /proc/<pid>/ns/user may already be the inner one, in which nobody could
        enter the network namespace. NS_GET_USERNS gives the user namespace that
        owns the network namespace, whatever bwrap did since.
        """
        try:
            net_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, ProcessLookupError):
            raise self._child_gone(pid) from None
        try:
            user_fd: int = fcntl.ioctl(net_fd, NS_GET_USERNS)
        except OSError:
            os.close(net_fd)
            raise
        return user_fd, net_fd

    def _set_firewall(self, pid: int) -> None:
        """Load the sandbox's nftables table (`firewall_ruleset`); raises `NetworkUnavailable`.

        The helper that loaded it stays (`NftHelper`): the resolver adds addresses
        through it and `denials` reads through it.
        """
        if self.tools.nftables is None:
            refusal = egress_refusal(self.tools, self.plan.egress)
            if refusal is not None:
                raise NetworkUnavailable(refusal)
            return  # `open`: the backend's health says so (NO_FIREWALL_NOTE)
        shown = self.resolver[0] if self.resolver is not None else HOST_RESOLV_CONF
        ruleset = host_ruleset(self.plan, shown)
        user_fd, net_fd = self._namespace_fds(pid)
        try:
            # setns refuses the user namespace one is in already (EINVAL): enter none then.
            same = _same_namespace(user_fd, "/proc/self/ns/user")
            helper, self._helper = self._helper, None
            if helper is None:
                helper = NftHelper.spawn(sys.executable, self.tools.nftables)
            self._nft = helper  # closed with the network from here on, whatever happens
            helper.enter((-1 if same else user_fd, net_fd))
            helper.run(ruleset)
            self._filler = SetFiller(self._nft.run, NFT_TABLE)
            if self._dns is not None:
                self._dns.start()
        except NftError as exc:
            raise NetworkUnavailable(
                f"the sandbox's firewall (nftables) could not be set: {exc}; "
                "check that this kernel has nf_tables and conntrack"
            ) from exc
        finally:
            os.close(user_fd)
            os.close(net_fd)

    def denials(self) -> list[Denial]:
        """What the firewall refused since the last call (`DenialLog.drain`); [] without one."""
        if self._nft is None:
            return []
        answers = []
        for name in DENIED_SETS:
            try:
                answers.append(self._nft.run(f"list set inet {NFT_TABLE} {name}", as_json=True))
            except NftError as exc:
                log.warning("reading the sandbox's denials: %s", exc)
        return self.denial_log.drain(merge_counts(answers))

    def _start_pasta(self, pid: int) -> None:
        user_fd, net_fd = self._namespace_fds(pid)
        # pasta cannot enter the user namespace it is in already (a root launcher's
        # sandbox has none of its own): then it enters only the network namespace.
        own = _same_namespace(user_fd, "/proc/self/ns/user")
        argv = pasta_argv(
            self.tools,
            (None if own else user_fd, net_fd),
            self.plan,
            os.geteuid() == 0,
            self._dns.port if self._dns is not None else None,
        )
        # A file, not a pipe: nobody reads pasta's stderr while the run goes on.
        self._pasta_log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        try:
            self._pasta = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._pasta_log,
                start_new_session=True,  # not in the sandbox's group: a stop SIGINT is not for it
                env={"PATH": "/usr/bin:/bin"},
                pass_fds=(user_fd, net_fd),
            )
        finally:
            os.close(user_fd)
            os.close(net_fd)

    def _ready(self, pid: int) -> bool:
        """pasta has configured the interface and listens on every forwarded port."""
        if self._child_exited():
            # Its /proc entries are gone: waiting on would look like a pasta that never got ready.
            raise self._child_gone(pid)
        if self._pasta is not None and self._pasta.poll() is not None:
            raise NetworkUnavailable(
                f"pasta exited with status {self._pasta.returncode}: {self._log_tail()}"
            )
        self._waiting_for = "pasta to configure the sandbox's interface"
        if not has_default_route(_read(f"/proc/{pid}/net/route")):
            return False
        missing = set(self.plan.loopback_ports) - listening_ports(_read(f"/proc/{pid}/net/tcp"))
        if missing:
            self._waiting_for = f"pasta to listen inside on {sorted(missing)}"
            return False
        if self._dns is not None and not udp_bound(_read(f"/proc/{pid}/net/udp"), 53):
            self._waiting_for = "pasta to listen inside on UDP 53 (the sandbox's resolver)"
            return False
        if self.plan.publish is not None:
            self._waiting_for = f"pasta to listen on the host's 127.0.0.1:{self.plan.publish[1]}"
            return self.plan.publish[1] in listening_ports(_read("/proc/self/net/tcp"))
        return True

    def _timed_out(self) -> NetworkUnavailable:
        return NetworkUnavailable(
            f"the sandbox's network was not up in {READY_TIMEOUT_S:.0f} s "
            f"(waiting for {self._waiting_for}; pasta said: {self._log_tail()})"
        )

    def _release(self) -> None:
        try:
            os.write(self._block_w, b"1")
        except BrokenPipeError:
            raise SandboxExited("the sandbox ended just before it was let go") from None
        finally:
            _close(self._block_w)
            self._block_w = -1

    async def attach(self) -> None:
        """Attach pasta to the started sandbox and let it go on; raises `NetworkUnavailable`.

        Once bwrap's loopback step is done, pasta and the firewall go in side by
        side (neither needs the other); the sandbox is let go once both are done.
        """
        firewall: threading.Thread | None = None
        try:
            with anyio.move_on_after(READY_TIMEOUT_S):
                pid = None
                while pid is None:
                    await anyio.wait_readable(self._info_r)
                    pid = self._read_info()
                while not self._networkable(pid):
                    await anyio.sleep(READY_POLL_S)
                firewall = self._begin_firewall(pid)
                self._waiting_for = "pasta to start"
                self._start_pasta(pid)
                while not self._ready(pid):
                    await anyio.sleep(READY_POLL_S)
                self._waiting_for = "the sandbox's firewall"
                if firewall.is_alive():  # usually done by now: no thread hop then
                    await anyio.to_thread.run_sync(firewall.join)
                self._end_firewall()
                self._release()
                return
            raise self._timed_out()
        finally:
            if firewall is not None and firewall.is_alive():
                # Never leave it running on the helper that `close` is about to end.
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(firewall.join)

    def attach_blocking(self) -> None:
        """`attach` for synchronous callers (the self-test, `crew-launcher sandbox`)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        pid = None
        while pid is None:
            pid = self._read_info()  # bwrap writes it at once, or exits (EOF)
        while not self._networkable(pid):
            if time.monotonic() > deadline:
                raise self._timed_out()
            time.sleep(READY_POLL_S)
        firewall = self._begin_firewall(pid)
        try:
            self._start_pasta(pid)
            while not self._ready(pid):
                if time.monotonic() > deadline:
                    raise self._timed_out()
                time.sleep(READY_POLL_S)
            self._waiting_for = "the sandbox's firewall"
        finally:
            firewall.join()
        self._end_firewall()
        self._release()

    def _begin_firewall(self, pid: int) -> threading.Thread:
        """Set the firewall (`_set_firewall`) in a thread of its own; `_end_firewall` after it."""

        def set_firewall() -> None:
            try:
                self._set_firewall(pid)
            except BaseException as exc:  # handed to the attach, which raises it
                self._firewall_error = exc

        thread = threading.Thread(target=set_firewall, name="sandbox-firewall", daemon=True)
        thread.start()
        return thread

    def _end_firewall(self) -> None:
        """Raise what setting the firewall raised, if anything."""
        error, self._firewall_error = self._firewall_error, None
        if error is not None:
            raise error

    @property
    def waiting_for(self) -> str:
        """What the attach waits for now (in its timeout message; tests watch it)."""
        return self._waiting_for

    @property
    def pasta_pid(self) -> int | None:
        """pasta's pid once attached: it holds the host side of a published port."""
        return self._pasta.pid if self._pasta is not None else None

    def _log_tail(self) -> str:
        if self._pasta_log is None:
            return ""
        self._pasta_log.seek(0)
        lines = self._pasta_log.read().decode("utf-8", "replace").splitlines()
        # Without a syslog, pasta says so for every message: leave those out.
        useful = [line for line in lines if "to syslog" not in line]
        return " / ".join(useful[-3:])[-500:] or "no message"

    def close(self, wait: bool = False) -> None:
        """Kill pasta and the firewall's helper, close every fd. Idempotent; call after the
        sandbox is gone.

        Returns without waiting for them to exit: pasta's exit (its socket pools,
        ~30 MB of buffers) takes tens of milliseconds, which would sit between the
        run's end and its exit frame; a thread reaps them (`_reap`), then starts
        the backend's next spare firewall helper. `wait`: reap them here (the
        self-test: a launcher reports ready with no zombie of its own).
        """
        for fd in (self._info_r, self._info_w, self._block_r, self._block_w):
            _close(fd)
        self._info_r = self._info_w = self._block_r = self._block_w = -1
        if self._child is not None:
            _close(self._child)
            self._child = None
        pasta = self._kill_pasta()
        if self._dns is not None:
            self._dns.close()
            self._dns = None
        if self._dns_conf is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._dns_conf)
            self._dns_conf = None
        helpers = [h for h in (self._nft, self._helper) if h is not None]
        self._nft = self._helper = None
        for helper in helpers:
            helper.kill()
        spare, self._spare = self._spare, None
        if wait:
            _reap(pasta, helpers, spare)
        elif pasta is not None or helpers or spare is not None:
            # The next spare starts here, at the run's end: not while this run or its
            # engine start wants the CPU (a cold OpenCode start is CPU-bound).
            threading.Thread(
                target=_reap, args=(pasta, helpers, spare), name="sandbox-network-reap", daemon=True
            ).start()

    def _kill_pasta(self) -> subprocess.Popen[bytes] | None:
        """SIGKILL pasta (nothing of its is worth a graceful exit; the sandbox is gone)."""
        pasta, self._pasta = self._pasta, None
        if pasta is not None:
            if pasta.poll() is None:
                pasta.kill()
            else:
                log.warning("pasta ended with status %s: %s", pasta.returncode, self._log_tail())
        if self._pasta_log is not None:
            self._pasta_log.close()
            self._pasta_log = None
        return pasta


def _reap(
    pasta: subprocess.Popen[bytes] | None, helpers: list[NftHelper], spare: NftSpare | None
) -> None:
    """Wait for what `close` killed (bounded: SIGKILL cannot be ignored); refill `spare`."""
    if pasta is not None:
        pasta.wait()
    for helper in helpers:
        helper.close()
    if spare is not None:
        spare.refill()


def _same_namespace(fd: int, path: str) -> bool:
    """Is the namespace `fd` the one at `path` (same inode on nsfs)?"""
    mine, theirs = os.stat(path), os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError as exc:
            log.warning("closing fd %d of the sandbox network: %s", fd, exc)


def free_loopback_port() -> int:
    """A TCP port free on the host's 127.0.0.1 now, for pasta to listen on (`publish`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port
