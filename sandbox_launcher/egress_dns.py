"""The resolver the launcher runs for a sandbox of egress mode `allow` or `none` (issue 23).

The sandbox's resolv.conf names 127.0.0.1; pasta forwards the sandbox's UDP
port 53 there to this resolver's port on the host's loopback (`-U 53:PORT`).
For a name an `allow` rule lists (`name`, or a subdomain for `*.name`) it
asks the host's own nameservers (the host's resolv.conf, as any program of
the launcher's would), and before it answers it adds each answered address
that is public (`crew_common.egress.is_public`) to the sandbox's nftables
sets (`network.ALLOWED_SETS`, through the sandbox's `NftHelper`) for the
answer's TTL, bounded to `MIN_TTL_S`..`MAX_TTL_S`; the sandbox is told that
same TTL, so it never connects with an address already gone from the set.
Every other name is answered REFUSED and recorded as a denial with its name
(`DenialLog.refused_name`). A name that resolves to a private address
(rebind.test → 169.254.169.254) is answered, but the address is not added:
the connection is refused at the firewall and recorded with the name.

So no host-name string decides what passes at connect time: the firewall
matches addresses only. UDP only (answers of A/AAAA and their CNAME chains
fit); other query types of an allowed name get an empty answer. Pure but for
`EgressResolver`.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from crew_common.egress import EgressPolicy, EgressRule, is_public

log = logging.getLogger(__name__)

A, CNAME, AAAA = 1, 5, 28
NOERROR, SERVFAIL, NXDOMAIN, REFUSED = 0, 2, 3, 5
MIN_TTL_S, MAX_TTL_S = 60, 3600
UPSTREAM_TIMEOUT_S = 2.0
MAX_PACKET = 4096


class Malformed(ValueError):
    """Not a DNS message we can read."""


@dataclass(frozen=True)
class Query:
    id: int
    flags: int
    name: str  # lower case, no trailing dot
    qtype: int
    question: bytes  # the question section as sent (echoed in the answer)


@dataclass(frozen=True)
class Record:
    name: str
    rtype: int
    ttl: int
    data: str  # an address, or a CNAME's target


def read_name(message: bytes, offset: int) -> tuple[str, int]:
    """A (possibly compressed) name at `offset`; the name and the offset after it. Pure."""
    labels: list[str] = []
    end = None
    for _ in range(128):  # pointer loops end here
        if offset >= len(message):
            raise Malformed("name runs past the message")
        length = message[offset]
        if length & 0xC0 == 0xC0:
            if offset + 1 >= len(message):
                raise Malformed("truncated pointer")
            if end is None:
                end = offset + 2
            offset = ((length & 0x3F) << 8) | message[offset + 1]
            continue
        if length == 0:
            name = ".".join(labels).lower()
            return name, (end if end is not None else offset + 1)
        label = message[offset + 1 : offset + 1 + length]
        if len(label) != length:
            raise Malformed("truncated label")
        labels.append(label.decode("ascii", "replace"))
        offset += 1 + length
    raise Malformed("name pointer loop")


def encode_name(name: str) -> bytes:
    out = b""
    for label in name.split(".") if name else []:
        raw = label.encode("ascii")
        if not 0 < len(raw) < 64:
            raise Malformed(f"bad label in {name!r}")
        out += bytes([len(raw)]) + raw
    return out + b"\0"


def parse_query(packet: bytes) -> Query:
    """The one question of a query. Pure; raises `Malformed`."""
    if len(packet) < 12:
        raise Malformed("shorter than a header")
    qid, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if flags & 0x8000 or qdcount != 1:
        raise Malformed("not a query of one question")
    name, offset = read_name(packet, 12)
    if offset + 4 > len(packet):
        raise Malformed("truncated question")
    (qtype,) = struct.unpack("!H", packet[offset : offset + 2])
    return Query(qid, flags, name, qtype, packet[12 : offset + 4])


def build_query(qid: int, name: str, qtype: int) -> bytes:
    """A recursive query for `name`. Pure."""
    return (
        struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
        + encode_name(name)
        + struct.pack("!HH", qtype, 1)
    )


def parse_answers(message: bytes, qid: int) -> tuple[int, list[Record]]:
    """The rcode and the A, AAAA and CNAME records of an answer to query `qid`. Pure."""
    if len(message) < 12:
        raise Malformed("shorter than a header")
    rid, flags, qdcount, ancount = struct.unpack("!HHHH", message[:8])
    if rid != qid or not flags & 0x8000:
        raise Malformed("not the answer to our query")
    offset = 12
    for _ in range(qdcount):
        _, offset = read_name(message, offset)
        offset += 4
    records = []
    for _ in range(ancount):
        name, offset = read_name(message, offset)
        if offset + 10 > len(message):
            raise Malformed("truncated record")
        rtype, _, ttl, length = struct.unpack("!HHIH", message[offset : offset + 10])
        offset += 10
        data = message[offset : offset + length]
        if rtype == A and length == 4:
            records.append(Record(name, A, ttl, str(ipaddress.IPv4Address(data))))
        elif rtype == AAAA and length == 16:
            records.append(Record(name, AAAA, ttl, str(ipaddress.IPv6Address(data))))
        elif rtype == CNAME:
            records.append(Record(name, CNAME, ttl, read_name(message, offset)[0]))
        offset += length
    return flags & 0xF, records


def build_answer(query: Query, rcode: int, records: Sequence[Record] = ()) -> bytes:
    """The answer to `query`: its question, `records` (no compression). Pure."""
    flags = 0x8000 | (query.flags & 0x0100) | 0x0080 | rcode  # QR, RD as asked, RA
    out = struct.pack("!HHHHHH", query.id, flags, 1, len(records), 0, 0) + query.question
    for record in records:
        if record.rtype == CNAME:
            data = encode_name(record.data)
        else:
            data = ipaddress.ip_address(record.data).packed
        out += encode_name(record.name)
        out += struct.pack("!HHIH", record.rtype, 1, record.ttl, len(data)) + data
    return out


def matching_rules(name: str, egress: EgressPolicy) -> list[EgressRule]:
    """The host rules that allow `name` (`name`, or `*.parent` for a subdomain). Pure."""
    found = []
    for rule in egress.rules:
        host = rule.host
        if host is None:
            continue
        if host.startswith("*."):
            if name.endswith(host[1:]) and name != host[2:]:
                found.append(rule)
        elif name == host:
            found.append(rule)
    return found


def bounded_ttl(records: Sequence[Record]) -> int:
    """The answer's TTL (its shortest) within `MIN_TTL_S`..`MAX_TTL_S`. Pure."""
    ttl = min((r.ttl for r in records), default=MIN_TTL_S)
    return max(MIN_TTL_S, min(ttl, MAX_TTL_S))


def set_elements(records: Sequence[Record], rules: Sequence[EgressRule]) -> list[tuple[str, str]]:
    """(set, element) for each public answered address and each rule's port. Pure."""
    elements = []
    for record in records:
        if record.rtype not in (A, AAAA):
            continue
        address = ipaddress.ip_address(record.data)
        if not is_public(address):
            continue  # a name pointing inside (metadata, the LAN): refused at connect
        family = "4" if address.version == 4 else "6"
        for rule in rules:
            if rule.port is None:
                elements.append((f"allowed{family}_all", str(address)))
            else:
                elements.append((f"allowed{family}", f"{address} . {rule.port}"))
    return list(dict.fromkeys(elements))


Upstream = Callable[[str, int], tuple[int, list[Record]]]


def ask_upstream(nameservers: Sequence[str]) -> Upstream:
    """A function that asks the first of `nameservers` that answers; (SERVFAIL, []) if none."""

    def ask(name: str, qtype: int) -> tuple[int, list[Record]]:
        for server in nameservers:
            qid = random.randrange(1 << 16)
            family = socket.AF_INET6 if ":" in server else socket.AF_INET
            try:
                with socket.socket(family, socket.SOCK_DGRAM) as s:
                    s.settimeout(UPSTREAM_TIMEOUT_S)
                    s.connect((server.split("%")[0], 53))
                    s.send(build_query(qid, name, qtype))
                    return parse_answers(s.recv(MAX_PACKET), qid)
            except (OSError, Malformed) as exc:
                log.info("nameserver %s did not answer %s: %s", server, name, exc)
        return SERVFAIL, []

    return ask


class EgressResolver:
    """One sandbox's resolver: a UDP socket on the host's 127.0.0.1 and a thread serving it.

    `allow(elements, ttl)` puts answered addresses into the sandbox's sets before
    the answer leaves; `refused(name)` and `answered(address, name)` feed the denials.
    """

    def __init__(
        self,
        egress: EgressPolicy,
        upstream: Upstream,
        allow: Callable[[list[tuple[str, str]], int], None],
        refused: Callable[[str], None],
        answered: Callable[[str, str], None],
    ) -> None:
        self.egress = egress
        self._upstream = upstream
        self._allow = allow
        self._refused = refused
        self._answered = answered
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        # `close` wakes the serving thread through this pair: no polling timeout, no delay.
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="egress-dns", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = select.poll()
        poller.register(self._socket.fileno(), select.POLLIN)
        poller.register(self._wake_r.fileno(), select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._wake_r.fileno() in ready:
                return
            try:
                packet, peer = self._socket.recvfrom(MAX_PACKET)
            except OSError:
                return
            try:
                answer = self.answer(packet)
            except Malformed:
                continue
            try:
                self._socket.sendto(answer, peer)
            except OSError as exc:
                log.info("the sandbox's resolver could not answer: %s", exc)

    def answer(self, packet: bytes) -> bytes:
        """The answer to one query from the sandbox (module doc); raises `Malformed`."""
        query = parse_query(packet)
        rules = matching_rules(query.name, self.egress)
        if not rules:
            self._refused(query.name)
            return build_answer(query, REFUSED)
        if query.qtype not in (A, AAAA):
            return build_answer(query, NOERROR)
        rcode, records = self._upstream(query.name, query.qtype)
        if rcode != NOERROR:
            return build_answer(query, rcode if rcode in (NXDOMAIN, SERVFAIL) else SERVFAIL)
        ttl = bounded_ttl(records)
        records = [Record(r.name, r.rtype, ttl, r.data) for r in records]
        for record in records:
            if record.rtype in (A, AAAA):
                self._answered(record.data, query.name)
        elements = set_elements(records, rules)
        if elements:
            try:
                self._allow(elements, ttl)
            except OSError as exc:
                log.warning("the sandbox's resolver could not allow %s: %s", query.name, exc)
                return build_answer(query, SERVFAIL)
        return build_answer(query, NOERROR, records)

    def close(self) -> None:
        self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        for sock in (self._socket, self._wake_r, self._wake_w):
            sock.close()


class SetFiller:
    """Adds elements to the sandbox's allowed sets, refreshing their timeouts (one batch each)."""

    def __init__(self, run: Callable[[str], str], table: str) -> None:
        self._run = run
        self._table = table
        self._expires: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def allow(self, elements: list[tuple[str, str]], ttl: int) -> None:
        now = time.monotonic()
        with self._lock:
            fresh = [e for e in elements if self._expires.get(e, 0.0) < now + ttl - 5]
            if not fresh:
                return
            known = [e for e in fresh if self._expires.get(e, 0.0) > now]
            adds = [self._command("add", s, e, ttl) for s, e in fresh]
            deletes = [self._command("delete", s, e, None) for s, e in known]
            try:
                # One transaction: the address is never out of the set in between.
                self._run("\n".join([*deletes, *adds]) + "\n")
            except OSError:
                if not deletes:
                    raise
                self._run("\n".join(adds) + "\n")  # some had expired already
            for element in fresh:
                self._expires[element] = now + ttl

    def _command(self, verb: str, name: str, element: str, ttl: int | None) -> str:
        timeout = f" timeout {ttl}s" if ttl is not None else ""
        return f"{verb} element inet {self._table} {name} {{ {element}{timeout} }}"
