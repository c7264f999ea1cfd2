"""What a sandbox's firewall refused: one record per (address, port, protocol) with a count.

The firewall's `refuse` chain (`network.firewall_ruleset`) adds each refused
packet's (address, protocol, port) to the `denied4`/`denied6` sets, whose
elements carry a packet counter: the kernel summarises, the launcher only
reads the sets (through the sandbox's `NftHelper`) and hands out what grew
since the last read (`DenialLog.drain`), with the host name when the
sandbox's resolver answered that address (or refused that name: a refused
name is a denial of its own, address empty, port 53). Pure but for `read`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass

DENIED_SETS = ("denied4", "denied6")
PROTOCOLS = {"tcp": "tcp", "udp": "udp", 6: "tcp", 17: "udp"}
MAX_NAMES = 4096  # addresses remembered with their name (the resolver's answers)


@dataclass(frozen=True)
class Denial:
    """Refused connections to one address, port and protocol: how many, and the name."""

    address: str
    port: int
    protocol: str  # "tcp" | "udp"
    name: str | None
    count: int

    def as_json(self) -> dict[str, object]:
        return {
            "address": self.address,
            "port": self.port,
            "protocol": self.protocol,
            "name": self.name,
            "count": self.count,
        }


Key = tuple[str, str, int]  # address, protocol, port


def parse_denied_set(text: str) -> dict[Key, int]:
    """The packet counts of a `list set` answer in nft's JSON. Pure; malformed parts are skipped."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    counts: dict[Key, int] = {}
    for item in data.get("nftables", []) if isinstance(data, dict) else []:
        for element in item.get("set", {}).get("elem", []) if isinstance(item, dict) else []:
            key, packets = _element(element)
            if key is not None:
                counts[key] = packets
    return counts


def _element(element: object) -> tuple[Key | None, int]:
    inner = element.get("elem") if isinstance(element, dict) else None
    if not isinstance(inner, dict):
        return None, 0
    value = inner.get("val", {})
    concat = value.get("concat") if isinstance(value, dict) else None
    counter = inner.get("counter") or {}
    if not (isinstance(concat, list) and len(concat) == 3 and isinstance(counter, dict)):
        return None, 0
    address, protocol, port = concat
    protocol = PROTOCOLS.get(protocol)
    if not isinstance(address, str) or protocol is None or not isinstance(port, int):
        return None, 0
    packets = counter.get("packets", 0)
    return (address, protocol, port), packets if isinstance(packets, int) else 0


class DenialLog:
    """The counts handed out so far and the names the resolver gave addresses."""

    def __init__(self) -> None:
        self._reported: dict[Key, int] = {}
        self._names: dict[str, str] = {}
        self._refused_names: dict[tuple[str, str], int] = {}  # (name, protocol): count
        self._lock = threading.Lock()  # the resolver's thread adds while a drain reads

    def name_address(self, address: str, name: str) -> None:
        """The resolver answered `name` with `address`: denials to it carry the name."""
        with self._lock:
            if len(self._names) < MAX_NAMES or address in self._names:
                self._names[address] = name

    def name_of(self, address: str) -> str | None:
        return self._names.get(address)

    def refused_name(self, name: str, protocol: str = "udp") -> None:
        """The resolver refused `name` (not allowed by the rules)."""
        key = (name, protocol)
        with self._lock:
            if key in self._refused_names or len(self._refused_names) < MAX_NAMES:
                self._refused_names[key] = self._refused_names.get(key, 0) + 1

    def drain(self, counts: dict[Key, int]) -> list[Denial]:
        """What grew since the last drain: `counts` (the sets' now) less what was handed out."""
        with self._lock:
            return self._drain(counts)

    def _drain(self, counts: dict[Key, int]) -> list[Denial]:
        found = []
        for key, count in sorted(counts.items()):
            grown = count - self._reported.get(key, 0)
            if grown > 0:
                address, protocol, port = key
                found.append(Denial(address, port, protocol, self._names.get(address), grown))
            self._reported[key] = count
        for (name, protocol), count in sorted(self._refused_names.items()):
            found.append(Denial("", 53, protocol, name, count))
        self._refused_names.clear()
        return found


def merge_counts(answers: Iterable[str]) -> dict[Key, int]:
    """`parse_denied_set` of each set's answer, in one mapping."""
    counts: dict[Key, int] = {}
    for text in answers:
        counts.update(parse_denied_set(text))
    return counts
