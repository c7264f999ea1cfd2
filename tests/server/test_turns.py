"""Turns: registration, ordered events with gaps, finish and usage, fencing, agent status."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.world import Computer, World

pytestmark = pytest.mark.anyio

AT = "2026-10-05T09:00:00+00:00"


def event(kind: str, **data: Any) -> dict[str, Any]:
    return {"type": kind, "at": AT, "data": data}


async def send(
    world: World,
    box: Computer,
    turn: dict[str, Any],
    first: int,
    events: list[dict[str, Any]],
    status: int = 204,
) -> dict[str, Any] | None:
    body = {"fence": turn["fence"], "first_index": first, "events": events}
    response = await world.client.post(
        f"/computer/turns/{turn['turn_id']}/events", json=body, headers=box.headers
    )
    assert response.status_code == status, response.text
    return response.json() if response.content else None


async def finish(
    world: World, box: Computer, turn: dict[str, Any], status: str = "succeeded", **extra: Any
) -> Any:
    body = {"fence": turn["fence"], "status": status, **extra}
    return await world.client.post(
        f"/computer/turns/{turn['turn_id']}/finish", json=body, headers=box.headers
    )


async def test_turn_records_rooms_input_events_in_order_and_usage(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    await world.post(room["id"], "hi")
    body = {
        "rooms": [{"room_id": room["id"], "from_seq": 1, "to_seq": 1}],
        "input": "It is Monday.\n- hi",
        "engine": "opencode",
        "model": "p/m",
        "session_id": None,
    }
    turn = await world.ok(
        "POST", f"/computer/agents/{alice['id']}/turns", json=body, headers=box.headers, status=201
    )
    assert turn["fence"] == 1
    await send(world, box, turn, 0, [event("step_start"), event("text", text="hello")])
    await send(
        world,
        box,
        turn,
        2,
        [
            event(
                "step_finish",
                reason="stop",
                tokens={
                    "input": 10,
                    "output": 5,
                    "reasoning": 1,
                    "cache_read": 2,
                    "cache_write": 0,
                },
                cost=0.25,
            ),
        ],
    )
    assert (await finish(world, box, turn)).status_code == 204

    record = await world.ok("GET", f"/api/turns/{turn['turn_id']}")
    assert record["status"] == "succeeded" and record["finished_at"] is not None
    assert record["rooms"] == body["rooms"] and record["input"] == body["input"]
    assert [(e["index"], e["type"]) for e in record["events"]] == [
        (0, "step_start"),
        (1, "text"),
        (2, "step_finish"),
    ]
    assert record["events"][1]["data"] == {"text": "hello"}
    assert record["usage"]["input_tokens"] == 10 and record["usage"]["cost"] == 0.25
    assert record["gaps"] == []
    listed = await world.ok("GET", "/api/turns", params={"agent_id": alice["id"]})
    assert [t["id"] for t in listed] == [turn["turn_id"]] and "events" not in listed[0]


async def test_a_dropped_batch_leaves_a_recorded_gap(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    turn = await world.register(box, alice)
    await send(world, box, turn, 0, [event("step_start"), event("text", text="a")])
    # the batch with indexes 2..4 was dropped by the reporter
    await send(world, box, turn, 5, [event("text", text="f")])
    await send(world, box, turn, 0, [event("step_start")])  # a repeat changes nothing
    record = await world.ok("GET", f"/api/turns/{turn['turn_id']}")
    assert [e["index"] for e in record["events"]] == [0, 1, 5]
    assert record["gaps"] == [{"from_index": 2, "to_index": 4}]


async def test_event_indexes_must_follow_first_index(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    turn = await world.register(box, alice)
    wrong = [{**event("text", text="x"), "index": 7}]
    answer = await send(world, box, turn, 0, wrong, status=409)
    assert answer is not None and answer["error"]["code"] == "conflict"
    assert "first_index" in answer["error"]["message"]


async def test_usage_is_summed_from_step_finish_when_finish_has_none(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    turn = await world.register(box, alice)
    step = event(
        "step_finish",
        reason="stop",
        tokens={"input": 3, "output": 4, "reasoning": 0, "cache_read": 1, "cache_write": 2},
        cost=0.5,
    )
    await send(world, box, turn, 0, [step, step])
    assert (await finish(world, box, turn, usage=None)).status_code == 204
    usage = (await world.ok("GET", f"/api/turns/{turn['turn_id']}"))["usage"]
    assert usage == {
        "input_tokens": 6,
        "output_tokens": 8,
        "reasoning_tokens": 0,
        "cache_read": 2,
        "cache_write": 4,
        "cost": 1.0,
    }


async def test_agent_status_follows_its_latest_turn(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)

    async def status() -> tuple[str, str | None]:
        agent = next(a for a in await world.ok("GET", "/api/agents") if a["id"] == alice["id"])
        return agent["status"], agent["problem"]

    assert await status() == ("idle", None)
    turn = await world.register(box, alice)
    assert await status() == ("replying", None)
    failure = {"class": "engine_error", "reason": "model said no"}
    assert (await finish(world, box, turn, "failed", failure=failure)).status_code == 204
    assert await status() == ("error", None)
    assert (await world.ok("GET", f"/api/turns/{turn['turn_id']}"))["failure"] == failure
    world.clock.advance(1)
    turn = await world.register(box, alice)
    assert (await finish(world, box, turn)).status_code == 204
    assert await status() == ("idle", None)
    await world.ok(
        "PUT",
        f"/computer/agents/{alice['id']}/problem",
        json={"reason": "sandbox unavailable: bwrap not found"},
        headers=box.headers,
    )
    assert await status() == ("idle", "sandbox unavailable: bwrap not found")
    await world.ok("DELETE", f"/computer/agents/{alice['id']}/problem", headers=box.headers)
    assert await status() == ("idle", None)


async def test_second_connect_fences_out_the_old_connection(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    old = await world.register(box, alice)
    assert await world.connect(box) == 2

    assert (await world.ok("GET", f"/api/turns/{old['turn_id']}"))["status"] == "interrupted"
    for path, body in (
        (
            f"/computer/turns/{old['turn_id']}/events",
            {"fence": old["fence"], "first_index": 0, "events": [event("step_start")]},
        ),
        (
            f"/computer/turns/{old['turn_id']}/finish",
            {"fence": old["fence"], "status": "succeeded"},
        ),
        (f"/computer/agents/{alice['id']}/ack", {"turn_id": old["turn_id"], "fence": old["fence"]}),
    ):
        answer = await world.client.post(path, json=body, headers=box.headers)
        assert answer.status_code == 409, (path, answer.text)
        assert answer.json()["error"]["code"] == "stale_turn"

    new = await world.register(box, alice)
    assert new["fence"] == 2
    await send(world, box, new, 0, [event("step_start")])
    assert (await finish(world, box, new)).status_code == 204


async def test_a_running_turn_of_the_current_connection_survives_nothing_but_connect(
    world: World,
) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    turn = await world.register(box, alice)
    stale = {**turn, "fence": turn["fence"] + 1}  # a fence the server never gave
    answer = await send(world, box, stale, 0, [event("step_start")], status=409)
    assert answer is not None and answer["error"]["code"] == "stale_turn"
    assert (await finish(world, box, turn)).status_code == 204
    again = await finish(world, box, turn)
    assert again.status_code == 409 and again.json()["error"]["code"] == "stale_turn"


async def test_registering_before_connect_is_refused(world: World) -> None:
    box = await world.computer(connect=False)
    alice = await world.agent("alice", box)
    body = {"rooms": [], "input": "x", "engine": "opencode", "model": "m"}
    answer = await world.client.post(
        f"/computer/agents/{alice['id']}/turns",
        json=body,
        headers=box.headers | {"Crew-Epoch": "1"},
    )
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "not_connected"


async def test_registering_a_turn_interrupts_the_agents_turn_that_lost_its_end(
    world: World,
) -> None:
    """Turns of one agent never overlap: a new one ends an older `running` one."""
    box = await world.computer()
    alice = await world.agent("alice", box)
    bob = await world.agent("bob", box)
    lost = await world.register(box, alice)  # its finish never arrives
    others = await world.register(box, bob)
    new = await world.register(box, alice)
    turns = {t["id"]: t for t in await world.ok("GET", f"/api/turns?agent_id={alice['id']}")}
    assert turns[lost["turn_id"]]["status"] == "interrupted"
    assert turns[lost["turn_id"]]["finished_at"] is not None
    assert turns[new["turn_id"]]["status"] == "running"
    answer = await finish(world, box, lost)
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "stale_turn"
    # Another agent's running turn is not touched.
    assert (await finish(world, box, others)).status_code == 204
    assert (await finish(world, box, new)).status_code == 204
