"""The launcher's resolver for `allow` and `none` (egress_dns): pure tables and one resolver."""

from __future__ import annotations

import socket
import struct

import pytest

from crew_common.egress import EgressPolicy
from sandbox_launcher.egress_dns import (
    AAAA,
    CNAME,
    MAX_TTL_S,
    MIN_TTL_S,
    NOERROR,
    REFUSED,
    A,
    EgressResolver,
    Malformed,
    Record,
    SetFiller,
    build_answer,
    build_query,
    matching_rules,
    parse_answers,
    parse_query,
    set_elements,
)

ALLOW = EgressPolicy.parse(
    {"mode": "allow", "allow": ["allowed.test:443", "*.wild.test", "rebind.test"]}
)


@pytest.mark.parametrize(
    ("name", "hosts"),
    [
        ("allowed.test", ["allowed.test"]),
        ("x.allowed.test", []),  # a plain name is not its subdomains
        ("a.wild.test", ["*.wild.test"]),
        ("a.b.wild.test", ["*.wild.test"]),
        ("wild.test", []),  # `*.` is the subdomains, not the name itself
        ("evilwild.test", []),
        ("other.test", []),
    ],
)
def test_only_listed_names_match(name: str, hosts: list[str]) -> None:
    assert [rule.host for rule in matching_rules(name, ALLOW)] == hosts


def test_only_public_addresses_go_in_with_each_rules_port() -> None:
    records = [
        Record("allowed.test", CNAME, 60, "cdn.test"),
        Record("cdn.test", A, 60, "203.0.113.10"),
        Record("cdn.test", A, 60, "169.254.169.254"),  # a rebinding answer
        Record("cdn.test", AAAA, 60, "::ffff:10.0.0.1"),
        Record("cdn.test", AAAA, 60, "2001:db8::10"),
    ]
    rules = matching_rules("allowed.test", ALLOW)
    assert set_elements(records, rules) == [
        ("allowed4", "203.0.113.10 . 443"),
        ("allowed6", "2001:db8::10 . 443"),
    ]
    every_port = matching_rules("rebind.test", ALLOW)
    assert set_elements(records[1:3], every_port) == [("allowed4_all", "203.0.113.10")]


def _upstream_answer(qid: int, name: str, records: list[Record]) -> bytes:
    query = parse_query(build_query(qid, name, A))
    return build_answer(query, NOERROR, records)


def test_a_query_and_an_answer_round_trip_with_a_cname_chain() -> None:
    query = parse_query(build_query(7, "Allowed.Test", A))
    assert (query.id, query.name, query.qtype) == (7, "allowed.test", A)
    records = [
        Record("allowed.test", CNAME, 30, "cdn.test"),
        Record("cdn.test", A, 30, "203.0.113.10"),
    ]
    assert parse_answers(_upstream_answer(7, "allowed.test", records), 7) == (NOERROR, records)
    with pytest.raises(Malformed):
        parse_answers(_upstream_answer(7, "allowed.test", records), 8)  # not our query
    with pytest.raises(Malformed):
        parse_query(b"\x00" * 5)
    # A compression pointer loop ends as malformed, not as a hang.
    loop = struct.pack("!HHHHHH", 1, 0, 1, 0, 0, 0) + b"\xc0\x0c" + b"\x00\x01\x00\x01"
    with pytest.raises(Malformed):
        parse_query(loop)


class Recorder:
    def __init__(self) -> None:
        self.allowed: list[tuple[list[tuple[str, str]], int]] = []
        self.refused: list[str] = []
        self.answered: list[tuple[str, str]] = []

    def resolver(self, answers: dict[str, list[Record]]) -> EgressResolver:
        def upstream(name: str, qtype: int) -> tuple[int, list[Record]]:
            return (NOERROR, answers.get(name, [])) if name in answers else (3, [])

        return EgressResolver(
            ALLOW,
            upstream,
            lambda elements, ttl: self.allowed.append((elements, ttl)),
            self.refused.append,
            lambda address, name: self.answered.append((address, name)),
        )


def test_the_resolver_allows_before_it_answers_and_refuses_the_rest() -> None:
    recorder = Recorder()
    short = [Record("allowed.test", A, 5, "203.0.113.10")]
    resolver = recorder.resolver(
        {"allowed.test": short, "rebind.test": [Record("rebind.test", A, 99999, "169.254.169.254")]}
    )
    try:
        rcode, records = parse_answers(resolver.answer(build_query(1, "allowed.test", A)), 1)
        # The TTL is bounded up to MIN_TTL_S, and the sandbox is told that same TTL.
        assert rcode == NOERROR and records == [
            Record("allowed.test", A, MIN_TTL_S, "203.0.113.10")
        ]
        assert recorder.allowed == [([("allowed4", "203.0.113.10 . 443")], MIN_TTL_S)]
        rcode, records = parse_answers(resolver.answer(build_query(2, "rebind.test", A)), 2)
        assert records[0].ttl == MAX_TTL_S and len(recorder.allowed) == 1  # never in the set
        assert ("169.254.169.254", "rebind.test") in recorder.answered
        rcode, records = parse_answers(resolver.answer(build_query(3, "other.test", A)), 3)
        assert (rcode, records) == (REFUSED, []) and recorder.refused == ["other.test"]
        rcode, _ = parse_answers(resolver.answer(build_query(4, "allowed.test", 16)), 4)
        assert rcode == NOERROR  # another type of an allowed name: an empty answer
    finally:
        resolver.close()


def test_the_resolver_serves_udp_on_the_hosts_loopback() -> None:
    recorder = Recorder()
    resolver = recorder.resolver({"allowed.test": [Record("allowed.test", A, 120, "203.0.113.10")]})
    resolver.start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(10)
            s.sendto(build_query(9, "allowed.test", A), ("127.0.0.1", resolver.port))
            rcode, records = parse_answers(s.recv(4096), 9)
        assert rcode == NOERROR and [r.data for r in records] == ["203.0.113.10"]
    finally:
        resolver.close()


def test_the_set_filler_refreshes_a_known_address_in_one_transaction() -> None:
    batches: list[str] = []
    filler = SetFiller(lambda text: batches.append(text) or "", "crew_sandbox")
    filler.allow([("allowed4", "203.0.113.10 . 443")], 60)
    filler.allow([("allowed4", "203.0.113.10 . 443")], 60)  # nothing new: no command
    filler.allow([("allowed4", "203.0.113.10 . 443")], 600)
    assert batches == [
        "add element inet crew_sandbox allowed4 { 203.0.113.10 . 443 timeout 60s }\n",
        "delete element inet crew_sandbox allowed4 { 203.0.113.10 . 443 }\n"
        "add element inet crew_sandbox allowed4 { 203.0.113.10 . 443 timeout 600s }\n",
    ]
