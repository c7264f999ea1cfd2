"""The firewall of each egress mode (issue 23), the wire form and the denial records: pure tables."""

from __future__ import annotations

import ipaddress
import json

import pytest
from pydantic import ValidationError

from crew_common.egress import EgressPolicy
from crew_common.launcher_wire import EgressWire, RunRequest, ServerRequest
from sandbox_launcher.denials import Denial, DenialLog, parse_denied_set
from sandbox_launcher.network import (
    OPEN,
    PUBLIC,
    NetworkPlan,
    PastaTools,
    egress_refusal,
    firewall_ruleset,
)

HOST4 = [ipaddress.IPv4Network("198.51.100.1/32")]
HOST6 = [ipaddress.IPv6Address("2001:db8:20::1")]
RESOLVERS = ["192.168.1.1", "fd00::53"]
ALLOW = EgressPolicy.parse(
    {"mode": "allow", "allow": ["github.com:443", "*.pypi.org", "10.99.0.1:22", "[2001:db8::/32]"]}
)


def ruleset(egress: EgressPolicy, forwarded: tuple[int, ...] = (8080,)) -> list[str]:
    return firewall_ruleset(HOST4, HOST6, 64, RESOLVERS, forwarded, egress).splitlines()


def position(lines: list[str], text: str) -> int:
    (index,) = [i for i, line in enumerate(lines) if line.strip() == text]
    return index


HOST_REFUSED = "ip daddr { 10.0.2.2/32, 198.51.100.1/32 } meta l4proto { tcp, udp } jump refuse"
CAP = "meta l4proto tcp ct state new ct status & confirmed == 0 ct count over 64 reject with tcp reset"
NOT_PUBLIC4 = (
    'oifname != "lo" ip daddr { 0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, '
    "172.16.0.0/12, 192.168.0.0/16, 224.0.0.0/3 } meta l4proto { tcp, udp } jump refuse"
)


@pytest.mark.parametrize("egress", [OPEN, PUBLIC, ALLOW, EgressPolicy(mode="none")])
def test_every_mode_keeps_the_host_refusals_the_loopback_and_the_cap(egress: EgressPolicy) -> None:
    lines = ruleset(egress)
    own = position(lines, 'oifname "lo" tcp dport != { 8080 } accept')
    assert own < position(lines, HOST_REFUSED) < position(lines, CAP)
    assert "    meta nfproto ipv4 update @denied4 { ip daddr . meta l4proto . th dport }" in lines
    assert "    meta l4proto tcp reject with tcp reset" in lines


def test_open_refuses_only_the_host() -> None:
    text = "\n".join(ruleset(OPEN))
    assert "10.0.0.0/8" not in text and "169.254" not in text
    assert "ip daddr 192.168.1.1 meta l4proto { tcp, udp } th dport 53 accept" in text


def test_public_refuses_exactly_the_not_public_ranges_but_the_nameservers() -> None:
    lines = ruleset(PUBLIC)
    refused = position(lines, NOT_PUBLIC4)
    # The resolv.conf nameservers (a LAN router's 192.168.1.1) keep their port 53, first.
    dns = position(lines, "ip daddr 192.168.1.1 meta l4proto { tcp, udp } th dport 53 accept")
    assert dns < refused
    (v6,) = [line for line in lines if line.startswith('    oifname != "lo" ip6 daddr { ::1/128')]
    # The IPv4-mapped forms as Python (and nft) write them: ::ffff:a9fe:0/112 is 169.254/16.
    for network in ("fc00::/7", "fe80::/10", "ff00::/8", "::ffff:a9fe:0/112", "::ffff:a00:0/104"):
        assert network in v6, v6
    assert "::ffff:7f00:0/104" in v6 and "::ffff:e000:0/99" in v6
    # The documentation ranges count as public (tests stand them up as the internet).
    assert "203.0.113" not in "\n".join(lines) and "2001:db8::/32" not in v6
    # The forwarded ports (127.0.0.1 inside) are not caught by 127.0.0.0/8's refusal:
    # they go through pasta to the host, which is refused only as its own addresses.
    assert "ct state established" not in "\n".join(lines)


def test_allow_accepts_its_ranges_and_the_resolvers_sets_and_refuses_the_rest() -> None:
    lines = ruleset(ALLOW)
    text = "\n".join(lines)
    assert "dport 53 accept" not in text  # no nameserver outside: the launcher's resolver
    closed = position(lines, "meta l4proto { tcp, udp } jump refuse")
    forwarded = position(lines, 'oifname "lo" accept')
    assert position(lines, CAP) < forwarded < closed
    ranges = [
        "ip daddr 10.99.0.1/32 meta l4proto { tcp, udp } th dport 22 accept",
        "ip6 daddr 2001:db8::/32 meta l4proto { tcp, udp } accept",
        "meta l4proto { tcp, udp } ip daddr . th dport @allowed4 accept",
        "meta l4proto { tcp, udp } ip6 daddr @allowed6_all accept",
    ]
    for rule in ranges:
        assert forwarded < position(lines, rule) < closed, rule
    assert position(lines, "icmp type echo-request drop") > closed
    assert "  set allowed4 { type ipv4_addr . inet_service; flags timeout; }" in lines
    # A name's addresses leaving the set end no connection opened while they were in it.
    assert lines[3] == "    ct state established,related accept"


def test_none_accepts_only_the_forwarded_ports() -> None:
    lines = ruleset(EgressPolicy(mode="none"))
    accepts = [line.strip() for line in lines if line.endswith("accept")]
    assert accepts == [
        "ct state established,related accept",
        'oifname "lo" tcp dport != { 8080 } accept',
        'oifname "lo" accept',
    ]
    assert "allowed4" not in "\n".join(lines)


def test_allow_without_names_has_no_resolver_sets() -> None:
    only_ranges = EgressPolicy.parse({"mode": "allow", "allow": ["203.0.113.0/24:443"]})
    text = "\n".join(ruleset(only_ranges))
    assert "ip daddr 203.0.113.0/24 meta l4proto { tcp, udp } th dport 443 accept" in text
    assert "@allowed4" not in text


def test_without_libnftables_only_open_runs() -> None:
    bare = PastaTools("/usr/bin/pasta", "/usr/bin/setpriv", None)
    assert egress_refusal(bare, OPEN) is None
    for egress in (PUBLIC, ALLOW, EgressPolicy(mode="none")):
        reason = egress_refusal(bare, egress)
        assert reason is not None and "only mode 'open' can run" in reason
        assert "apt install nftables" in reason
    assert egress_refusal(PastaTools("p", "s", "/usr/lib/libnftables.so.1"), PUBLIC) is None
    assert NetworkPlan().egress == PUBLIC


def _run_body(**extra: object) -> dict[str, object]:
    return {
        "run_id": "r1",
        "agent_id": "a1",
        "agent_dir": "/a",
        "runtime_dir": "/r",
        "bin_dir": "/b",
        "model": "p/m",
        **extra,
    }


def test_the_wire_defaults_to_public_and_carries_the_rules() -> None:
    assert RunRequest.model_validate(_run_body()).egress.policy() == PUBLIC
    wire = ALLOW.as_wire()
    request = RunRequest.model_validate(_run_body(egress=wire))
    assert request.egress.policy() == ALLOW
    assert EgressWire.of(ALLOW).model_dump() == wire
    server = {"agent_id": "a1", "agent_dir": "/a", "runtime_dir": "/r", "bin_dir": "/b"}
    server["env"] = {"OPENCODE_SERVER_PASSWORD": "p" * 32}  # type: ignore[assignment]
    assert ServerRequest.model_validate({**server, "egress": wire}).egress.policy() == ALLOW
    assert ServerRequest.model_validate(server).egress.policy() == PUBLIC


@pytest.mark.parametrize(
    ("egress", "reason"),
    [
        ({"mode": "public", "rules": [{"host": "a.test"}]}, "takes no allow rules"),
        ({"mode": "allow", "rules": [{"host": "a b"}]}, "is not a host name"),
        ({"mode": "allow", "rules": [{}]}, "exactly one of host and network"),
        ({"mode": "allow", "rules": [{"host": "a.test", "network": "10.0.0.0/8"}]}, "exactly one"),
        ({"mode": "allow", "rules": [{"network": "10.0.0.0/33"}]}, "not an address or range"),
        ({"mode": "allow", "rules": [{"host": "a.test", "port": 0}]}, "greater than or equal"),
        ({"mode": "shut"}, "'open', 'public', 'allow' or 'none'"),
        ({"mode": "public", "allow": []}, "Extra inputs"),
    ],
)
def test_a_bad_policy_is_refused_with_its_reason(egress: object, reason: str) -> None:
    with pytest.raises(ValidationError) as caught:
        RunRequest.model_validate(_run_body(egress=egress))
    assert reason in str(caught.value)


def _set(*elements: tuple[str, str, int, int]) -> str:
    elem = [
        {"elem": {"val": {"concat": [a, p, port]}, "counter": {"packets": n, "bytes": 60 * n}}}
        for a, p, port, n in elements
    ]
    return json.dumps({"nftables": [{"metainfo": {}}, {"set": {"name": "denied4", "elem": elem}}]})


def test_denials_are_summarised_and_drained_with_their_names() -> None:
    counts = parse_denied_set(_set(("10.99.0.1", "tcp", 80, 3), ("169.254.169.254", "udp", 53, 1)))
    assert counts == {("10.99.0.1", "tcp", 80): 3, ("169.254.169.254", "udp", 53): 1}
    assert parse_denied_set("not json") == {} and parse_denied_set('{"nftables": [{}]}') == {}
    log = DenialLog()
    log.name_address("169.254.169.254", "rebind.test")
    log.refused_name("other.test")
    log.refused_name("other.test")
    first = log.drain(counts)
    assert first == [
        Denial("10.99.0.1", 80, "tcp", None, 3),
        Denial("169.254.169.254", 53, "udp", "rebind.test", 1),
        Denial("", 53, "udp", "other.test", 2),
    ]
    # Only what grew since: the next drain has one more packet to 10.99.0.1.
    later = parse_denied_set(_set(("10.99.0.1", "tcp", 80, 4), ("169.254.169.254", "udp", 53, 1)))
    assert log.drain(later) == [Denial("10.99.0.1", 80, "tcp", None, 1)]
    assert log.drain(later) == []
