"""An agent's egress policy: where its sandbox may open connections (issue 23).

One definition for the server (which stores it with the agent and refuses a
bad one with a reason), the Computer (which passes it to the launcher) and
the launcher (which turns it into its sandbox's firewall). Four modes:

- `open`: everything but the host itself (the host's own addresses and
  loopback ports other than the forwarded ones are refused in every mode).
- `public` (the default): the public internet only; never a range of
  `NOT_PUBLIC` (private, shared, link-local and metadata, multicast, reserved,
  and the IPv6 equivalents, IPv4-mapped forms included). Exactly that list:
  the documentation ranges (192.0.2/24, 198.51.100/24, 203.0.113/24,
  2001:db8::/32) count as public, so tests can stand them up as "internet".
- `allow`: only the listed host names and address ranges (each with one port,
  or every port), plus the crew server and the model gateway. A host name is
  matched on the answers of the resolver the launcher runs for the sandbox,
  so what passes is decided on addresses; an address a name resolves to must
  be public (a name pointing at 169.254.169.254 is refused), while a listed
  range is taken as written.
- `none`: only the crew server and the model gateway.

The user's form, stored on the server and shown everywhere:
`{"mode": "allow", "allow": ["github.com", "*.pypi.org:443", "203.0.113.0/24"]}`.
A rule is `NAME`, `*.NAME` (its subdomains, not itself), an address, a CIDR
range, each optionally `:PORT`; an IPv6 address or range with a port is
written in brackets (`[2001:db8::/32]:443`). `as_wire` gives the launcher's
structured form. Pure.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MODES = ("open", "public", "allow", "none")
DEFAULT_MODE = "public"
MAX_RULES = 64
MAX_RULE_LENGTH = 300

# What `public` never reaches (the list, exactly): IPv4 and IPv6, with the
# IPv4-mapped (::ffff:0:0/96) forms of the IPv4 ranges refused too.
NOT_PUBLIC_V4 = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
)
NOT_PUBLIC_V6 = ("::1/128", "fe80::/10", "fc00::/7", "ff00::/8")

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_BRACKETED = re.compile(r"^\[([^\]]+)\](?::(\d+))?$")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class EgressError(ValueError):
    """A policy that cannot be used; the message says what is wrong and how to write it."""


def not_public_networks() -> list[Network]:
    """`NOT_PUBLIC_V4` and `NOT_PUBLIC_V6` as networks, with the IPv4-mapped forms."""
    v4 = [ipaddress.IPv4Network(n) for n in NOT_PUBLIC_V4]
    mapped = [ipaddress.IPv6Network(f"::ffff:{n.network_address}/{96 + n.prefixlen}") for n in v4]
    return [*v4, *(ipaddress.IPv6Network(n) for n in NOT_PUBLIC_V6), *mapped]


def is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """True when `address` lies in none of the `public` mode's refused ranges."""
    return not any(address in network for network in not_public_networks())


@dataclass(frozen=True)
class EgressRule:
    """One `allow` entry: a host name (`*.` for subdomains) or an address range, and a port."""

    host: str | None = None
    network: str | None = None
    port: int | None = None  # None: every port

    def text(self) -> str:
        """The rule as the user writes it (normalised)."""
        target = self.host or self.network or ""
        if self.port is None:
            return target
        if self.network is not None and ":" in self.network:
            return f"[{target}]:{self.port}"
        return f"{target}:{self.port}"

    def as_wire(self) -> dict[str, Any]:
        return {"host": self.host, "network": self.network, "port": self.port}

    @classmethod
    def parse(cls, text: Any) -> EgressRule:
        """One rule of the user's form; raises `EgressError` with the reason."""
        if not isinstance(text, str):
            raise EgressError(f"an allow rule is a string such as 'github.com:443', not {text!r}")
        raw = text.strip().lower()
        if not raw or len(raw) > MAX_RULE_LENGTH:
            raise EgressError(
                f"allow rule {text[:80]!r}: empty or over {MAX_RULE_LENGTH} characters"
            )
        target, port = _split_port(raw, text)
        network = _network(target)
        if network is not None:
            return cls(network=str(network), port=port)
        return cls(host=_host(target, text), port=port)


@dataclass(frozen=True)
class EgressPolicy:
    """An agent's egress mode and, for `allow`, its rules."""

    mode: str = DEFAULT_MODE
    rules: tuple[EgressRule, ...] = ()

    @classmethod
    def parse(cls, data: Any) -> EgressPolicy:
        """The user's form (`None`: the default); raises `EgressError` with the reason."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise EgressError('egress is an object: {"mode": "public"} or {"mode": "allow", ...}')
        unknown = sorted(set(data) - {"mode", "allow"})
        if unknown:
            raise EgressError(f"egress has unknown fields: {', '.join(map(str, unknown))}")
        mode = data.get("mode", DEFAULT_MODE)
        if mode not in MODES:
            raise EgressError(f"egress mode {mode!r} is not one of {', '.join(MODES)}")
        allow = data.get("allow", [])
        if not isinstance(allow, list):
            raise EgressError("egress allow is a list of rules such as 'github.com:443'")
        if allow and mode != "allow":
            raise EgressError(f'egress mode {mode!r} takes no allow rules (use "mode": "allow")')
        if len(allow) > MAX_RULES:
            raise EgressError(f"egress allow has {len(allow)} rules; at most {MAX_RULES}")
        rules = tuple(dict.fromkeys(EgressRule.parse(rule) for rule in allow))
        return cls(mode=mode, rules=rules)

    def as_json(self) -> dict[str, Any]:
        """The user's form, normalised: what the server stores and shows."""
        return {"mode": self.mode, "allow": [rule.text() for rule in self.rules]}

    def as_wire(self) -> dict[str, Any]:
        """The launcher's form: the mode and structured rules."""
        return {"mode": self.mode, "rules": [rule.as_wire() for rule in self.rules]}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> EgressPolicy:
        """`as_wire`'s inverse, checked as strictly as the user's form."""
        rules = [EgressRule(**dict(rule)).text() for rule in data.get("rules", [])]
        return cls.parse({"mode": data.get("mode", DEFAULT_MODE), "allow": rules})

    def summary(self) -> str:
        """One line for `/agents` and status: `public`, or `allow github.com:443, …`."""
        if self.mode != "allow":
            return self.mode
        return "allow " + (", ".join(rule.text() for rule in self.rules) or "nothing listed")


def _split_port(raw: str, text: str) -> tuple[str, int | None]:
    bracketed = _BRACKETED.match(raw)
    if bracketed:
        target, port_text = bracketed.group(1), bracketed.group(2)
    elif raw.count(":") == 1:
        target, port_text = raw.split(":")
    else:
        # No port, or a bare IPv6 address or range (which has no port without brackets).
        target, port_text = raw, None
    if port_text is None:
        return target, None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise EgressError(f"allow rule {text!r}: the port is a number from 1 to 65535")
    return target, int(port_text)


def _network(target: str) -> Network | None:
    try:
        return ipaddress.ip_network(target, strict=False)
    except ValueError:
        if "/" in target or target.replace(".", "").isdigit() or ":" in target:
            raise EgressError(
                f"allow rule {target!r} is not an address or range "
                "(write 203.0.113.0/24, 203.0.113.5:443 or [2001:db8::/32]:443)"
            ) from None
        return None


def _host(target: str, text: str) -> str:
    name = target.removeprefix("*.")
    name = name.removesuffix(".")
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise EgressError(
            f"allow rule {text!r} is not a host name, address or range "
            "(write github.com, *.pypi.org:443 or 203.0.113.0/24)"
        )
    if labels[-1].isdigit():
        raise EgressError(f"allow rule {text!r}: a host name does not end in a number")
    return ("*." if target.startswith("*.") else "") + name
