"""Delivered and read positions: claims deliver, ack reads, unacked messages come back."""

from __future__ import annotations

import pytest

from tests.server.world import World

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
