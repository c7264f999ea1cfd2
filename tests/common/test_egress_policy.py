"""The egress policy's user form: what is accepted, normalised, and refused with a reason."""

from __future__ import annotations

import ipaddress

import pytest

from crew_common.egress import EgressError, EgressPolicy, EgressRule, is_public


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("github.com", EgressRule(host="github.com")),
        ("GitHub.COM.", EgressRule(host="github.com")),
        ("*.pypi.org:443", EgressRule(host="*.pypi.org", port=443)),
        ("203.0.113.0/24", EgressRule(network="203.0.113.0/24")),
        ("203.0.113.9/24:5432", EgressRule(network="203.0.113.0/24", port=5432)),
        ("198.51.100.7", EgressRule(network="198.51.100.7/32")),
        ("2001:db8::1", EgressRule(network="2001:db8::1/128")),
        ("[2001:db8::/32]:443", EgressRule(network="2001:db8::/32", port=443)),
    ],
)
def test_rules_are_read_and_normalised(text: str, rule: EgressRule) -> None:
    assert EgressRule.parse(text) == rule
    assert EgressRule.parse(rule.text()) == rule


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("github.com:0", "port"),
        ("github.com:99999", "port"),
        ("github.com:https", "port"),
        ("300.1.2.3", "not an address"),
        ("10.0.0.0/33", "not an address"),
        ("exa mple.com", "not a host name"),
        ("-bad.com", "not a host name"),
        ("", "empty"),
        ("a" * 400, "over"),
        (443, "a string"),
    ],
)
def test_bad_rules_are_refused_with_the_reason(text: object, says: str) -> None:
    with pytest.raises(EgressError, match=says):
        EgressRule.parse(text)


def test_the_policy_defaults_to_public_and_round_trips() -> None:
    assert EgressPolicy.parse(None) == EgressPolicy("public")
    policy = EgressPolicy.parse({"mode": "allow", "allow": ["github.com", "github.com", "::1"]})
    assert policy.as_json() == {"mode": "allow", "allow": ["github.com", "::1/128"]}
    assert EgressPolicy.from_wire(policy.as_wire()) == policy
    assert policy.summary() == "allow github.com, ::1/128"
    assert EgressPolicy.parse({"mode": "allow"}).summary() == "allow nothing listed"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"mode": "everything"}, "not one of"),
        ({"mode": "public", "allow": ["github.com"]}, "takes no allow rules"),
        ({"mode": "allow", "allow": "github.com"}, "a list"),
        ({"mode": "allow", "hosts": []}, "unknown fields: hosts"),
        ({"mode": "allow", "allow": [f"h{i}.com" for i in range(65)]}, "at most 64"),
        ("public", "an object"),
    ],
)
def test_bad_policies_are_refused_with_the_reason(data: object, says: str) -> None:
    with pytest.raises(EgressError, match=says):
        EgressPolicy.parse(data)


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("203.0.113.10", True),
        ("198.51.100.1", True),
        ("192.0.2.1", True),
        ("2001:db8::5", True),
        ("8.8.8.8", True),
        ("10.99.0.1", False),
        ("172.31.255.1", False),
        ("192.168.1.1", False),
        ("100.64.0.1", False),
        ("169.254.169.254", False),
        ("127.0.0.2", False),
        ("0.1.2.3", False),
        ("224.0.0.1", False),
        ("255.255.255.255", False),
        ("::1", False),
        ("fe80::1", False),
        ("fd00::1", False),
        ("ff02::1", False),
        ("::ffff:169.254.169.254", False),
        ("::ffff:10.0.0.1", False),
        ("::ffff:203.0.113.10", True),
    ],
)
def test_public_is_exactly_the_documented_list(address: str, public: bool) -> None:
    assert is_public(ipaddress.ip_address(address)) is public
