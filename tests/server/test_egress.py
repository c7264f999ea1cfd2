"""Issue 23 on the server: each agent's egress policy (stored, checked by
`crew_common.egress`, editable, sent to its Computer), the `egress_denied` turn event
and the model gateway's usage in the turn records; on both stores."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.test_turns import event, finish, send
from tests.server.world import Computer, World

pytestmark = pytest.mark.anyio

PUBLIC = {"mode": "public", "allow": []}


def agent_body(handle: str, box: Computer, **more: Any) -> dict[str, Any]:
    return {"handle": handle, "name": handle.title(), "model": "m/x", "computer_id": box.id, **more}


async def computer_agent(world: World, box: Computer, agent_id: str) -> dict[str, Any]:
    agents = await world.ok("GET", "/computer/agents", headers=box.headers)
    return dict(next(a for a in agents if a["id"] == agent_id))


async def test_an_agent_is_public_by_default_in_every_record(world: World) -> None:
    box = await world.computer()
    made = await world.agent("alice", box)
    assert made["egress"] == PUBLIC
    listed = await world.ok("GET", "/api/agents")
    assert listed[0]["egress"] == PUBLIC
    assert (await computer_agent(world, box, made["id"]))["egress"] == PUBLIC


async def test_a_policy_given_at_creation_is_stored_normalised(world: World) -> None:
    box = await world.computer()
    egress = {"mode": "allow", "allow": ["GitHub.com:443", "github.com:443", "203.0.113.0/24"]}
    made = await world.ok(
        "POST", "/api/agents", json=agent_body("alice", box, egress=egress), status=201
    )
    # lower-cased, the repeated rule once: the form `crew_common.egress` gives back
    expected = {"mode": "allow", "allow": ["github.com:443", "203.0.113.0/24"]}
    assert made["egress"] == expected
    assert (await computer_agent(world, box, made["id"]))["egress"] == expected


async def test_a_patch_replaces_the_policy_and_tells_the_computer(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    before = world.cursor()
    changed = await world.ok(
        "PATCH", f"/api/agents/{alice['id']}", json={"egress": {"mode": "none"}}
    )
    assert changed["egress"] == {"mode": "none", "allow": []}
    assert world.events(box, before) == [("agents", {"agent_id": alice["id"]})]
    assert (await computer_agent(world, box, alice["id"]))["egress"]["mode"] == "none"

    # null, or a patch of other fields, leaves the policy as it is
    kept = await world.ok("PATCH", f"/api/agents/{alice['id']}", json={"egress": None})
    assert kept["egress"]["mode"] == "none"
    renamed = await world.ok("PATCH", f"/api/agents/{alice['id']}", json={"name": "Al"})
    assert renamed["egress"]["mode"] == "none"


@pytest.mark.parametrize(
    ("egress", "reason"),
    [
        ({"mode": "allow", "allow": ["github.com:99999"]}, "the port is a number from 1 to 65535"),
        ({"mode": "public", "allow": ["github.com"]}, "takes no allow rules"),
        ({"mode": "sideways"}, "is not one of open, public, allow, none"),
        ({"mode": "allow", "allow": ["10.0.0.0/33"]}, "is not an address or range"),
    ],
)
async def test_a_policy_it_cannot_read_is_refused_with_the_reason_and_nothing_stored(
    world: World, egress: dict[str, Any], reason: str
) -> None:
    box = await world.computer()
    refused = await world.client.post("/api/agents", json=agent_body("bob", box, egress=egress))
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["code"] == "invalid_egress" and reason in error["message"]
    assert await world.ok("GET", "/api/agents") == []

    alice = await world.agent("alice", box)
    before = world.cursor()
    patched = await world.client.patch(
        f"/api/agents/{alice['id']}", json={"egress": egress, "name": "Changed"}
    )
    assert patched.status_code == 422 and reason in patched.json()["error"]["message"]
    shown = (await world.ok("GET", "/api/agents"))[0]
    assert shown["egress"] == PUBLIC and shown["name"] == "Alice"
    assert world.events(box, before) == []


async def test_an_unknown_field_of_the_policy_is_refused(world: World) -> None:
    box = await world.computer()
    egress = {"mode": "allow", "alow": ["github.com"]}
    refused = await world.client.post("/api/agents", json=agent_body("bob", box, egress=egress))
    assert refused.status_code == 422 and "egress.alow" in refused.json()["error"]["message"]


async def test_egress_denied_events_are_kept_with_their_data(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    turn = await world.register(box, alice)
    denied = event(
        "egress_denied", address="10.99.0.1", port=80, protocol="tcp", name=None, count=3
    )
    await send(world, box, turn, 0, [denied])
    record = await world.ok("GET", f"/api/turns/{turn['turn_id']}")
    assert [(e["type"], e["data"]) for e in record["events"]] == [
        (
            "egress_denied",
            {"address": "10.99.0.1", "port": 80, "protocol": "tcp", "name": None, "count": 3},
        )
    ]


GATEWAY = {
    "requests": 3,
    "input_tokens": 120,
    "output_tokens": 40,
    "cache_read": 7,
    "cache_write": 1,
    "rate_limited": 1,
    "refused": 2,
    "upstream_errors": 0,
    "bytes_up": 2048,
    "bytes_down": 65536,
    "retry_after_s": 2.5,
}


async def test_the_gateway_usage_is_recorded_next_to_the_engine_usage(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    turn = await world.register(box, alice)
    usage = {"input_tokens": 100, "output_tokens": 30, "cost": 0.5}
    answer = await finish(world, box, turn, usage=usage, gateway_usage=GATEWAY)
    assert answer.status_code == 204
    record = await world.ok("GET", f"/api/turns/{turn['turn_id']}")
    assert record["gateway_usage"] == GATEWAY
    assert record["usage"]["input_tokens"] == 100
    listed = await world.ok("GET", "/api/turns", params={"agent_id": alice["id"]})
    assert listed[0]["gateway_usage"] == GATEWAY


async def test_a_turn_without_a_gateway_has_none(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    running = await world.register(box, alice)
    assert (await world.ok("GET", f"/api/turns/{running['turn_id']}"))["gateway_usage"] is None
    assert (await finish(world, box, running)).status_code == 204
    assert (await world.ok("GET", f"/api/turns/{running['turn_id']}"))["gateway_usage"] is None


async def test_gateway_usage_of_the_wrong_shape_is_refused(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    turn = await world.register(box, alice)
    answer = await finish(world, box, turn, gateway_usage={**GATEWAY, "requests": -1})
    assert answer.status_code == 422
    assert "gateway_usage.requests" in answer.json()["error"]["message"]
    assert (await world.ok("GET", f"/api/turns/{turn['turn_id']}"))["status"] == "running"
