"""Who is woken (upstream.md): one test per rule."""

from __future__ import annotations

from datetime import timedelta

import pytest

from crew_server.clock import iso
from tests.server.world import World, bearer

pytestmark = pytest.mark.anyio


async def test_dm_wakes_the_agent(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    before = world.cursor()
    await world.post(room["id"], "hello")
    assert world.wakes(box, before) == [alice["id"]]


async def test_agent_reply_in_dm_wakes_nobody(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    token = await world.token(box, alice)
    before = world.cursor()
    assert (await world.reply(token, room["id"], "hi user")).status_code == 201
    assert world.wakes(box, before) == []


async def test_group_wakes_every_member_but_the_author(world: World) -> None:
    box = await world.computer()
    alice, bob, carol = [await world.agent(h, box) for h in ("alice", "bob", "carol")]
    room = await world.group("launch", alice, bob, carol)
    token = await world.token(box, alice)
    before = world.cursor()
    await world.post(room["id"], "morning all")
    assert sorted(world.wakes(box, before)) == sorted([alice["id"], bob["id"], carol["id"]])
    await world.unread(box, alice)
    before = world.cursor()
    assert (await world.reply(token, room["id"], "morning")).status_code == 201
    assert sorted(world.wakes(box, before)) == sorted([bob["id"], carol["id"]])


async def test_muted_agent_is_not_woken_by_group_messages(world: World) -> None:
    box = await world.computer()
    alice, bob = await world.agent("alice", box), await world.agent("bob", box)
    room = await world.group("launch", alice, bob)
    bob_token = await world.token(box, bob)
    await world.ok("PUT", f"/agent/mutes/{room['id']}", json={}, headers=bearer(bob_token))
    before = world.cursor()
    await world.post(room["id"], "status please")
    assert world.wakes(box, before) == [alice["id"]]


async def test_muted_agent_is_woken_when_mentioned(world: World) -> None:
    box = await world.computer()
    alice, bob = await world.agent("alice", box), await world.agent("bob", box)
    room = await world.group("launch", alice, bob)
    bob_token = await world.token(box, bob)
    until = iso(world.clock.now() + timedelta(hours=2))
    await world.ok(
        "PUT", f"/agent/mutes/{room['id']}", json={"until": until}, headers=bearer(bob_token)
    )
    before = world.cursor()
    message = await world.post(room["id"], "@bob can you check?")
    assert message["mentions"] == [bob["id"]]
    assert sorted(world.wakes(box, before)) == sorted([alice["id"], bob["id"]])


async def test_a_mute_that_ran_out_no_longer_silences(world: World) -> None:
    box = await world.computer()
    bob = await world.agent("bob", box)
    room = await world.group("launch", bob)
    bob_token = await world.token(box, bob)
    until = iso(world.clock.now() + timedelta(minutes=30))
    await world.ok(
        "PUT", f"/agent/mutes/{room['id']}", json={"until": until}, headers=bearer(bob_token)
    )
    world.clock.advance(31 * 60)
    before = world.cursor()
    await world.post(room["id"], "anyone?")
    assert world.wakes(box, before) == [bob["id"]]


async def test_unmuting_wakes_nobody_and_muted_messages_come_at_next_wake(world: World) -> None:
    box = await world.computer()
    alice, bob = await world.agent("alice", box), await world.agent("bob", box)
    room = await world.group("launch", alice, bob)
    bob_token = await world.token(box, bob)
    await world.ok("PUT", f"/agent/mutes/{room['id']}", json={}, headers=bearer(bob_token))
    await world.post(room["id"], "while muted")
    before = world.cursor()
    await world.ok("DELETE", f"/agent/mutes/{room['id']}", headers=bearer(bob_token))
    await world.ok("DELETE", f"/api/agents/{bob['id']}/mutes/{room['id']}")  # the user's way too
    assert world.events(box, before) == []
    await world.post(room["id"], "after unmute")
    assert bob["id"] in world.wakes(box, before)
    rooms = await world.unread(box, bob)
    assert [m["body"] for m in rooms[0]["messages"]] == ["while muted", "after unmute"]


async def test_thread_wakes_mentioned_writers_and_root_author_only(world: World) -> None:
    box = await world.computer()
    alice, bob, carol, dave = [await world.agent(h, box) for h in ("alice", "bob", "carol", "dave")]
    room = await world.group("launch", alice, bob, carol, dave)
    alice_token = await world.token(box, alice)
    bob_token = await world.token(box, bob)
    await world.post(room["id"], "kick-off")
    await world.unread(box, alice)
    root = await world.reply(alice_token, room["id"], "plan: ship friday")
    root_id = (await world.messages(room["id"]))[-1]["id"]
    assert root.status_code == 201

    before = world.cursor()
    first = await world.post(room["id"], "@bob thoughts?", thread_of=root_id)
    # alice wrote the root; bob is mentioned; carol and dave are not involved
    assert sorted(world.wakes(box, before)) == sorted([alice["id"], bob["id"]])

    await world.unread(box, bob)
    before = world.cursor()
    sent = await world.reply(bob_token, first["room_id"], "looks good")
    assert sent.status_code == 201, sent.text
    assert world.wakes(box, before) == [alice["id"]]

    before = world.cursor()
    await world.post(first["room_id"], "thanks both")
    assert sorted(world.wakes(box, before)) == sorted([alice["id"], bob["id"]])


async def test_agent_without_a_computer_is_woken_nowhere(world: World) -> None:
    box = await world.computer()
    lone = await world.agent("lone", None)
    room = await world.dm(lone)
    before = world.cursor()
    await world.post(room["id"], "are you there?")
    assert world.events(box, before) == []
    assert (await world.ok("GET", f"/api/agents/{lone['id']}/positions"))[0]["read_seq"] == 0
