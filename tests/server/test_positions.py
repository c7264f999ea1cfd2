"""Delivered and read positions: claims deliver, ack reads, unacked messages come back."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.world import Computer, World

pytestmark = pytest.mark.anyio


async def test_claim_marks_delivered_and_ack_moves_read(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    await world.post(room["id"], "one")
    await world.post(room["id"], "two")
    assert (await world.positions(alice))[room["id"]] == (0, 0)

    rooms = await world.unread(box, alice)
    assert [m["seq"] for m in rooms[0]["messages"]] == [1, 2]
    assert (await world.positions(alice))[room["id"]] == (2, 0)

    turn = await world.register(box, alice)
    await world.ok(
        "POST",
        f"/computer/agents/{alice['id']}/ack",
        json={"turn_id": turn["turn_id"], "fence": turn["fence"]},
        headers=box.headers,
    )
    assert (await world.positions(alice))[room["id"]] == (2, 2)
    assert await world.unread(box, alice) == []


async def test_unacked_messages_come_back_with_new_ones(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    await world.post(room["id"], "old")
    first = await world.unread(box, alice)
    assert [m["body"] for m in first[0]["messages"]] == ["old"]
    # the turn failed: no ack
    await world.post(room["id"], "new")
    again = await world.unread(box, alice)
    assert [m["body"] for m in again[0]["messages"]] == ["old", "new"]


async def test_unread_rooms_come_in_order_of_their_oldest_message(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    dm = await world.dm(alice)
    group = await world.group("ops", alice)
    await world.post(group["id"], "first, in the group")
    world.clock.advance(1)
    await world.post(dm["id"], "then a dm")
    world.clock.advance(1)
    await world.post(group["id"], "group again")
    rooms = await world.unread(box, alice)
    assert [r["room"]["id"] for r in rooms] == [group["id"], dm["id"]]
    assert [m["seq"] for m in rooms[0]["messages"]] == [1, 2]
    group_view = rooms[0]["room"]
    assert group_view["kind"] == "group" and group_view["title"] == "ops"
    assert [m["kind"] for m in group_view["members"]] == ["user", "agent"]
    assert group_view["muted"] is False


async def test_seq_increases_by_one_per_room(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    a, b = await world.dm(alice), await world.group("g", alice)
    seqs = [(await world.post(r["id"], "x"))["seq"] for r in (a, b, a, a, b)]
    assert seqs == [1, 1, 2, 3, 2]


async def ack(world: World, box: Computer, agent: dict[str, Any]) -> None:
    turn = await world.register(box, agent)
    await world.ok(
        "POST",
        f"/computer/agents/{agent['id']}/ack",
        json={"turn_id": turn["turn_id"], "fence": turn["fence"]},
        headers=box.headers,
    )
    await world.ok(
        "POST",
        f"/computer/turns/{turn['turn_id']}/finish",
        json={"fence": turn["fence"], "status": "succeeded"},
        headers=box.headers,
    )


async def claim(world: World, box: Computer, agent: dict[str, Any]) -> tuple[list[Any], bool]:
    answer = await world.ok("POST", f"/computer/agents/{agent['id']}/unread", headers=box.headers)
    return [(r["room"]["id"], [m["seq"] for m in r["messages"]]) for r in answer["rooms"]], answer[
        "more"
    ]


async def test_a_big_backlog_comes_in_bounded_claims_and_each_ack_wakes_for_the_rest(
    small_claims_world: World,
) -> None:
    world = small_claims_world
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    for i in range(7):
        await world.post(room["id"], f"message {i}")
    assert await claim(world, box, alice) == ([(room["id"], [1, 2, 3])], True)
    assert (await world.positions(alice))[room["id"]] == (3, 0)
    # the turn failed (no ack): the same first part comes again, and nothing wakes
    before = world.cursor()
    assert await claim(world, box, alice) == ([(room["id"], [1, 2, 3])], True)
    assert world.wakes(box, before) == []
    await ack(world, box, alice)
    assert world.wakes(box, before) == [alice["id"]]  # for the rest
    assert (await world.positions(alice))[room["id"]] == (3, 3)
    assert await claim(world, box, alice) == ([(room["id"], [4, 5, 6])], True)
    await ack(world, box, alice)
    assert await claim(world, box, alice) == ([(room["id"], [7])], False)
    before = world.cursor()
    await ack(world, box, alice)
    assert world.wakes(box, before) == []  # nothing left: no extra wake
    assert (await world.positions(alice))[room["id"]] == (7, 7)
    assert await claim(world, box, alice) == ([], False)


async def test_the_claim_bound_counts_characters_and_leaves_later_rooms_undelivered(
    small_claims_world: World,
) -> None:
    world = small_claims_world
    box = await world.computer()
    alice = await world.agent("alice", box)
    dm, group = await world.dm(alice), await world.group("ops", alice)
    await world.post(dm["id"], "x" * 150)  # alone over the bound: still claimed
    world.clock.advance(1)
    await world.post(dm["id"], "short")
    world.clock.advance(1)
    await world.post(group["id"], "y" * 40)
    await world.post(group["id"], "y" * 40)
    await world.post(group["id"], "y" * 40)
    assert await claim(world, box, alice) == ([(dm["id"], [1])], True)
    assert await world.positions(alice) == {dm["id"]: (1, 0), group["id"]: (0, 0)}
    await ack(world, box, alice)
    assert await claim(world, box, alice) == ([(dm["id"], [2]), (group["id"], [1, 2])], True)
    assert await world.positions(alice) == {dm["id"]: (2, 1), group["id"]: (2, 0)}
    await ack(world, box, alice)
    assert await claim(world, box, alice) == ([(group["id"], [3])], False)


async def test_a_reply_after_a_cut_claim_is_held_in_bounded_parts_too(
    small_claims_world: World,
) -> None:
    world = small_claims_world
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    token = await world.token(box, alice)
    for i in range(7):
        await world.post(room["id"], f"message {i}")
    assert await claim(world, box, alice) == ([(room["id"], [1, 2, 3])], True)
    held = await world.reply(token, room["id"], "answer")
    assert held.status_code == 409
    assert [m["seq"] for m in held.json()["rooms"][0]["messages"]] == [4, 5, 6]
    held = await world.reply(token, room["id"], "answer")
    assert [m["seq"] for m in held.json()["rooms"][0]["messages"]] == [7]
    sent = await world.reply(token, room["id"], "answer")
    assert sent.status_code == 201
    await ack(world, box, alice)  # all of it was seen in this turn: nothing comes again
    assert await world.positions(alice) == {room["id"]: (8, 8)}
    assert await claim(world, box, alice) == ([], False)
