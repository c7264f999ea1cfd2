"""HELD: a reply to a room with unseen messages from others is held and returns them."""

from __future__ import annotations

import pytest

from tests.server.world import World, bearer

pytestmark = pytest.mark.anyio


async def test_reply_is_held_with_unseen_messages_then_sent_on_resend(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.group("launch", alice)
    token = await world.token(box, alice)
    await world.post(room["id"], "first")
    await world.unread(box, alice)  # alice has seen seq 1
    unseen = await world.post(room["id"], "wait, one more thing")

    held = await world.reply(token, room["id"], "Done.")
    assert held.status_code == 409
    answer = held.json()
    assert answer["held"] is True and answer["agent_id"] == alice["id"]
    assert [r["room"]["id"] for r in answer["rooms"]] == [room["id"]]
    assert [m["id"] for m in answer["rooms"][0]["messages"]] == [unseen["id"]]
    assert [m["body"] for m in await world.messages(room["id"])] == ["first", unseen["body"]]
    assert (await world.positions(alice))[room["id"]] == (2, 0)  # now delivered, not read

    sent = await world.reply(token, room["id"], "Done.")
    assert sent.status_code == 201, sent.text
    assert sent.json()["room_id"] == room["id"]
    bodies = [m["body"] for m in await world.messages(room["id"])]
    assert bodies == ["first", unseen["body"], "Done."]


async def test_reply_with_everything_seen_is_posted_at_once(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    token = await world.token(box, alice)
    await world.post(room["id"], "hello")
    await world.unread(box, alice)
    sent = await world.reply(token, room["id"], "hi")
    assert sent.status_code == 201
    assert "thread_id" not in sent.json()


async def test_own_messages_never_hold_a_reply(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    token = await world.token(box, alice)
    assert (await world.reply(token, room["id"], "one")).status_code == 201
    assert (await world.reply(token, room["id"], "two")).status_code == 201


async def test_the_notices_of_an_agents_own_task_actions_do_not_hold_its_report(
    world: World,
) -> None:
    """A claim and a status change post notices in the task's thread; the agent that made them
    has seen them, so its report in that thread goes through (they are not "from others")."""
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.group("launch", alice)
    token = await world.token(box, alice)
    task = await world.ok(
        "POST",
        "/api/tasks",
        json={"room_id": room["id"], "title": "Changelog", "assignee": "alice"},
        status=201,
    )
    await world.unread(box, alice)  # the host message and the 'created' notice
    number = task["number"]
    for path, body in (
        (f"/agent/tasks/{number}/claim", None),
        (f"/agent/tasks/{number}/status", {"status": "in_review", "note": "written"}),
    ):
        await world.ok("POST", path, headers=bearer(token), json=body)

    sent = await world.reply(token, task["thread_id"], "Ready for review.")

    assert sent.status_code == 201, sent.text
    bodies = [m["body"] for m in await world.messages(task["thread_id"])]
    assert bodies[-1] == "Ready for review." and len(bodies) == 4


async def test_an_own_notice_after_an_unseen_message_still_holds_and_shows_both(
    world: World,
) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.group("launch", alice)
    token = await world.token(box, alice)
    task = await world.ok(
        "POST",
        "/api/tasks",
        json={"room_id": room["id"], "title": "Changelog", "assignee": "alice"},
        status=201,
    )
    await world.unread(box, alice)
    unseen = await world.post(
        room["id"], "also the date, please", thread_of=task["host_message_id"]
    )
    await world.ok("POST", f"/agent/tasks/{task['number']}/claim", headers=bearer(token))

    held = await world.reply(token, task["thread_id"], "On it.")

    assert held.status_code == 409
    [shown] = held.json()["rooms"]
    bodies = [m["body"] for m in shown["messages"]]
    assert bodies[0] == unseen["body"] and "claimed task" in bodies[1], bodies
