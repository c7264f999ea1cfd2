"""Delivery at the edges, the server's part (docs/contracts.md, issue 10): the connection
epoch on every Computer call, narrow claims, setting messages aside, the event count at
the end of a turn, bounded HELD."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.world import Computer, World, turn_registration

pytestmark = pytest.mark.anyio


def superseded(response: Any) -> bool:
    return bool(response.status_code == 409 and response.json()["error"]["code"] == "superseded")


async def test_a_replaced_connection_is_told_superseded_and_gets_nothing(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    await world.post(room["id"], "hello")
    old = Computer(box.id, box.token, box.epoch)
    await world.connect(box)  # the app started twice: a second connection, same token
    assert box.epoch == old.epoch + 1

    calls = [
        ("POST", f"/computer/agents/{alice['id']}/token", None),
        ("POST", f"/computer/agents/{alice['id']}/unread", None),
        (
            "POST",
            f"/computer/agents/{alice['id']}/turns",
            {"rooms": [], "input": "x", "engine": "opencode", "model": "m/x"},
        ),
        ("GET", "/computer/agents", None),
        ("PUT", "/computer/models", {"models": ["m/x"]}),
    ]
    for method, path, body in calls:
        answer = await world.client.request(method, path, json=body, headers=old.headers)
        assert superseded(answer), (path, answer.status_code, answer.text)
        assert "another crew-computer" in answer.json()["error"]["message"]
    # The old connection claimed nothing: the message waits for the current one.
    assert (await world.positions(alice))[room["id"]] == (0, 0)
    [claimed] = await world.unread(box, alice)
    assert [m["body"] for m in claimed["messages"]] == ["hello"]


async def test_a_turn_gets_the_callers_epoch_as_its_fence(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    turn = await world.register(box, alice)
    assert turn["fence"] == box.epoch


async def test_the_epoch_header_is_required_and_checked(world: World) -> None:
    box = await world.computer()
    bare = {"Authorization": f"Bearer {box.token}"}
    missing = await world.client.get("/computer/agents", headers=bare)
    assert missing.status_code == 400 and "Crew-Epoch" in missing.json()["error"]["message"]
    for bad in ("x", "-1", "1.5", "99999999999999999999"):
        answer = await world.client.get("/computer/agents", headers=bare | {"Crew-Epoch": bad})
        assert answer.status_code == 400, bad
    future = await world.client.get(
        "/computer/agents", headers=bare | {"Crew-Epoch": str(box.epoch + 1)}
    )
    assert future.status_code == 422
    assert (await world.client.get("/computer/agents", headers=box.headers)).status_code == 200


async def test_a_narrow_claim_takes_only_the_oldest_messages(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    for body in ("one", "two", "three"):
        await world.post(room["id"], body)
    answer = await world.ok(
        "POST",
        f"/computer/agents/{alice['id']}/unread",
        json={"max_messages": 1},
        headers=box.headers,
    )
    assert answer["more"] is True
    assert [m["body"] for r in answer["rooms"] for m in r["messages"]] == ["one"]
    assert (await world.positions(alice))[room["id"]] == (1, 0)
    for bad in (0, 201, "1"):
        refused = await world.client.post(
            f"/computer/agents/{alice['id']}/unread",
            json={"max_messages": bad},
            headers=box.headers,
        )
        assert refused.status_code == 422, bad


async def claimed_turn(world: World, box: Computer, agent: dict[str, Any]) -> dict[str, Any]:
    """Claim the agent's unread messages and register a turn for them."""
    rooms = await world.unread(box, agent)
    body = turn_registration(rooms)
    path = f"/computer/agents/{agent['id']}/turns"
    return dict(await world.ok("POST", path, json=body, headers=box.headers, status=201))


async def test_set_aside_marks_read_and_tells_the_room_why(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    await world.post(room["id"], "the poison")
    turn = await claimed_turn(world, box, alice)
    cursor = world.cursor()
    await world.ok(
        "POST",
        f"/computer/agents/{alice['id']}/ack",
        json={
            "turn_id": turn["turn_id"],
            "fence": turn["fence"],
            "set_aside": {"reason": "engine_error: the engine crashed"},
        },
        headers=box.headers,
    )
    messages = await world.messages(room["id"])
    notice = messages[-1]
    assert notice["kind"] == "notice" and notice["author"]["kind"] == "system"
    assert notice["body"] == (
        "@alice could not handle 1 message here and set it aside unanswered: "
        "engine_error: the engine crashed"
    )
    # Read, the notice included (it is about alice herself), and nobody is woken by it.
    assert (await world.positions(alice))[room["id"]] == (2, 2)
    assert world.wakes(box, cursor) == []
    assert await world.unread(box, alice) == []
    # A newer message flows again.
    await world.post(room["id"], "a new question")
    [fresh] = await world.unread(box, alice)
    assert [m["body"] for m in fresh["messages"]] == ["a new question"]


async def test_set_aside_marks_read_only_its_own_claim_not_what_a_held_answer_delivered(
    world: World,
) -> None:
    # Issue 20: MK2 arrives during MK1's turn and reaches the agent only through a HELD
    # answer (delivered moves past MK1); MK1 is set aside. Only MK1 may be marked read.
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    other = await world.group("elsewhere", alice)
    mk1 = await world.post(room["id"], "MK1")
    token = await world.token(box, alice)
    # The narrowed retry's claim: MK1 alone.
    turn = await claimed_turn_of(world, box, alice, max_messages=1)
    await world.post(other["id"], "in another room")
    mk2 = await world.post(room["id"], "MK2")
    held = await world.reply(token, room["id"], "answer to MK1")
    assert held.status_code == 409 and held.json()["held"] is True
    assert (await world.positions(alice))[room["id"]][0] == mk2["seq"]
    await world.ok(
        "POST",
        f"/computer/agents/{alice['id']}/ack",
        json={
            "turn_id": turn["turn_id"],
            "fence": turn["fence"],
            "set_aside": {"reason": "engine_error: the model call failed"},
        },
        headers=box.headers,
    )
    _, read = (await world.positions(alice))[room["id"]]
    assert read == mk1["seq"]
    assert (await world.positions(alice))[other["id"]][1] == 0  # not in the turn: untouched
    claimed = {
        r["room"]["id"]: [m["body"] for m in r["messages"]] for r in await world.unread(box, alice)
    }
    assert claimed[room["id"]][0] == "MK2", claimed
    assert any(b.startswith("@alice could not handle 1 message") for b in claimed[room["id"]])
    assert claimed[other["id"]] == ["in another room"]


async def claimed_turn_of(
    world: World, box: Computer, agent: dict[str, Any], max_messages: int
) -> dict[str, Any]:
    """Claim at most `max_messages` and register a turn for them."""
    answer = await world.ok(
        "POST",
        f"/computer/agents/{agent['id']}/unread",
        json={"max_messages": max_messages},
        headers=box.headers,
    )
    rooms = answer["rooms"]
    body = turn_registration(rooms)
    path = f"/computer/agents/{agent['id']}/turns"
    return dict(await world.ok("POST", path, json=body, headers=box.headers, status=201))


async def test_the_event_count_at_the_end_records_a_lost_tail_as_a_gap(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    turn = await world.register(box, alice)
    event = {"type": "text", "at": "2026-01-01T00:00:00Z", "data": {"text": "hi"}}
    await world.ok(
        "POST",
        f"/computer/turns/{turn['turn_id']}/events",
        json={"fence": turn["fence"], "first_index": 0, "events": [event, event]},
        headers=box.headers,
    )
    await world.ok(
        "POST",
        f"/computer/turns/{turn['turn_id']}/finish",
        json={"fence": turn["fence"], "status": "failed", "event_count": 156},
        headers=box.headers,
    )
    recorded = await world.ok("GET", f"/api/turns/{turn['turn_id']}")
    assert recorded["gaps"] == [{"from_index": 2, "to_index": 155}]
    assert len(recorded["events"]) == 2


async def test_a_complete_turn_has_no_gap(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    turn = await world.register(box, alice)
    await world.ok(
        "POST",
        f"/computer/turns/{turn['turn_id']}/finish",
        json={"fence": turn["fence"], "status": "succeeded", "event_count": 0},
        headers=box.headers,
    )
    assert (await world.ok("GET", f"/api/turns/{turn['turn_id']}"))["gaps"] == []


async def test_held_twice_the_third_reply_is_posted_and_the_unseen_come_next(
    world: World,
) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.group("busy", alice)
    token = await world.token(box, alice)
    await world.post(room["id"], "question")
    await world.unread(box, alice)
    for n in (1, 2):
        await world.post(room["id"], f"chatter {n}")
        held = await world.reply(token, room["id"], "my answer")
        assert held.status_code == 409 and held.json()["held"] is True, n
    unseen = await world.post(room["id"], "chatter 3")
    posted = await world.reply(token, room["id"], "my answer")
    assert posted.status_code == 201, posted.text
    bodies = [m["body"] for m in await world.messages(room["id"])]
    assert bodies == ["question", "chatter 1", "chatter 2", "chatter 3", "my answer"]
    # What alice never saw stays undelivered: her next claim brings it.
    delivered, _ = (await world.positions(alice))[room["id"]]
    assert delivered == unseen["seq"] - 1
    [next_claim] = await world.unread(box, alice)
    assert "chatter 3" in [m["body"] for m in next_claim["messages"]]


async def test_the_held_count_starts_afresh_after_a_post_and_a_claim(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.group("busy", alice)
    token = await world.token(box, alice)
    await world.post(room["id"], "q")
    await world.unread(box, alice)
    await world.post(room["id"], "c1")
    assert (await world.reply(token, room["id"], "a")).status_code == 409
    assert (await world.reply(token, room["id"], "a")).status_code == 201  # saw c1
    await world.post(room["id"], "c2")
    assert (await world.reply(token, room["id"], "b")).status_code == 409
    await world.post(room["id"], "c3")
    assert (await world.reply(token, room["id"], "b")).status_code == 409
    await world.unread(box, alice)  # a new turn's claim
    await world.post(room["id"], "c4")
    assert (await world.reply(token, room["id"], "c")).status_code == 409


async def test_a_conditional_ack_needs_a_reply_in_every_room_of_the_turn(world: World) -> None:
    """A turn that failed after its answers went out is acked (`only_if_answered`), one
    that never answered is not: nothing changes and the messages come back."""
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    token = await world.token(box, alice)
    await world.post(room["id"], "a question")
    turn = await claimed_turn(world, box, alice)
    path = f"/computer/agents/{alice['id']}/ack"
    body = {"turn_id": turn["turn_id"], "fence": turn["fence"], "only_if_answered": True}
    refused = await world.client.post(path, json=body, headers=box.headers)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_answered"
    assert (await world.positions(alice))[room["id"]] == (1, 0)
    assert (await world.reply(token, room["id"], "the answer")).status_code == 201
    await world.ok("POST", path, json=body, headers=box.headers)
    delivered, read = (await world.positions(alice))[room["id"]]
    assert read == delivered >= 1
