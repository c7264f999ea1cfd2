"""The server acks the rooms a turn answered when the turn ends without its ack (issue 22):
failed, interrupted by a new connection (a Computer killed), or a reply landing late."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.test_delivery_edges import claimed_turn
from tests.server.world import Computer, World

pytestmark = pytest.mark.anyio


async def finish(world: World, box: Computer, turn: dict[str, Any], status: str) -> None:
    body = {
        "fence": turn["fence"],
        "status": status,
        "failure": {"class": "reply_refused", "reason": "timed out"},
    }
    await world.ok(
        "POST", f"/computer/turns/{turn['turn_id']}/finish", json=body, headers=box.headers
    )


async def test_a_failed_turn_that_answered_a_room_leaves_it_read(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    answered = await world.dm(alice)
    silent = await world.group("quiet", alice)
    token = await world.token(box, alice)
    await world.post(answered["id"], "a question")
    await world.post(silent["id"], "another")
    turn = await claimed_turn(world, box, alice)
    assert (await world.reply(token, answered["id"], "the answer")).status_code == 201
    await finish(world, box, turn, "failed")
    positions = await world.positions(alice)
    assert positions[answered["id"]][1] >= 1  # answered: its claim is read
    assert positions[silent["id"]] == (1, 0)  # not answered: unread, as before
    claim = await world.unread(box, alice)
    assert [r["room"]["id"] for r in claim] == [silent["id"]]


async def test_a_failed_turn_that_answered_nothing_leaves_everything_unread(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    await world.post(room["id"], "a question")
    turn = await claimed_turn(world, box, alice)
    await finish(world, box, turn, "failed")
    assert (await world.positions(alice))[room["id"]] == (1, 0)


async def test_a_reply_landing_after_its_turn_failed_acks_that_room(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    token = await world.token(box, alice)
    await world.post(room["id"], "a question")
    turn = await claimed_turn(world, box, alice)
    await finish(world, box, turn, "failed")  # the reply timed out: reply_refused
    assert (await world.positions(alice))[room["id"]] == (1, 0)
    assert (await world.reply(token, room["id"], "late answer")).status_code == 201
    assert (await world.positions(alice))[room["id"]][1] >= 1
    assert await world.unread(box, alice) == []


async def test_a_turn_of_a_vanished_computer_acks_what_it_answered(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    token = await world.token(box, alice)
    await world.post(room["id"], "a question")
    await claimed_turn(world, box, alice)
    assert (await world.reply(token, room["id"], "the answer")).status_code == 201
    await world.connect(box)  # the Computer was killed -9 and started again
    assert (await world.positions(alice))[room["id"]][1] >= 1
    assert await world.unread(box, alice) == []
