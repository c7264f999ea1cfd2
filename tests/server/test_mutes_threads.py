"""Mutes (limits; groups only) and threads (create, then reuse; summary on the root)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from crew_server.clock import iso
from tests.server.world import World, bearer

pytestmark = pytest.mark.anyio


async def test_mute_limits_and_room_kinds(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    group, dm = await world.group("launch", alice), await world.dm(alice)
    token = await world.token(box, alice)
    now = world.clock.now()

    async def mute(room_id: str, until: str | None) -> tuple[int, dict[str, object]]:
        answer = await world.client.put(
            f"/agent/mutes/{room_id}", json={"until": until}, headers=bearer(token)
        )
        return answer.status_code, answer.json()

    status, body = await mute(group["id"], iso(now + timedelta(minutes=10)))
    assert status == 409 and "at least 15 minutes" in str(body)
    status, body = await mute(group["id"], iso(now + timedelta(days=8)))
    assert status == 409 and "at most 7 days" in str(body)
    assert await mute(group["id"], iso(now + timedelta(minutes=15))) == (
        200,
        {"room_id": group["id"], "until": iso(now + timedelta(minutes=15))},
    )
    assert await mute(group["id"], iso(now + timedelta(days=7))) == (
        200,
        {"room_id": group["id"], "until": iso(now + timedelta(days=7))},
    )
    assert await mute(group["id"], None) == (200, {"room_id": group["id"], "until": None})

    status, body = await mute(dm["id"], None)
    assert status == 409 and body["error"]["code"] == "refused"  # type: ignore[index]
    await world.post(group["id"], "root")
    root = (await world.messages(group["id"]))[-1]
    reply = await world.post(group["id"], "in a thread", thread_of=root["id"])
    status, body = await mute(reply["room_id"], None)
    assert status == 409 and "only groups can be muted" in body["error"]["message"]  # type: ignore[index]

    rooms = await world.unread(box, alice)
    view = next(r["room"] for r in rooms if r["room"]["id"] == group["id"])
    assert view["muted"] is True and view["muted_until"] is None


async def test_thread_of_creates_then_reuses_the_thread(world: World) -> None:
    box = await world.computer()
    alice, bob = await world.agent("alice", box), await world.agent("bob", box)
    group = await world.group("launch", alice, bob)
    token = await world.token(box, alice)
    root = await world.post(group["id"], "Shall we ship friday?")
    await world.unread(box, alice)

    first = await world.reply(token, group["id"], "Yes, if tests pass.", thread_of=root["id"])
    assert first.status_code == 201, first.text
    thread_id = first.json()["thread_id"]
    assert first.json()["room_id"] == group["id"]
    world.clock.advance(60)
    second = await world.reply(token, group["id"], "Tests pass.", thread_of=root["id"])
    assert second.status_code == 201 and second.json()["thread_id"] == thread_id

    timeline = await world.messages(group["id"])
    assert [m["body"] for m in timeline] == ["Shall we ship friday?"]  # replies stay in the thread
    assert timeline[0]["thread"] == {
        "id": thread_id,
        "replies": 2,
        "last_at": iso(world.clock.now()),
    }
    in_thread = await world.messages(thread_id)
    assert [(m["seq"], m["body"]) for m in in_thread] == [
        (1, "Yes, if tests pass."),
        (2, "Tests pass."),
    ]
    user_reply = await world.post(group["id"], "great", thread_of=root["id"])
    assert user_reply["room_id"] == thread_id
    room = await world.ok("GET", f"/api/rooms/{thread_id}")
    assert room["kind"] == "thread" and room["parent_room_id"] == group["id"]
    assert room["parent_title"] == "launch" and room["root_message"]["id"] == root["id"]
    assert room["parent_kind"] == "group"
    assert room["root_message_id"] == root["id"]
    assert (await world.ok("GET", f"/api/rooms/{group['id']}"))["root_message_id"] is None
    assert [m["handle"] for m in room["members"]] == [None, "alice", "bob"]


async def test_thread_of_a_message_elsewhere_is_invalid(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    a, b = await world.group("a", alice), await world.group("b", alice)
    token = await world.token(box, alice)
    message = await world.post(a["id"], "here")
    await world.unread(box, alice)
    wrong = await world.reply(token, b["id"], "there", thread_of=message["id"])
    assert wrong.status_code == 422 and wrong.json()["error"]["code"] == "invalid"
    missing = await world.reply(
        token, a["id"], "x", thread_of="00000000-0000-4000-8000-000000000000"
    )
    assert missing.status_code == 404


async def test_threads_hang_off_group_messages_only(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    dm, group = await world.dm(alice), await world.group("launch", alice)
    token = await world.token(box, alice)
    in_dm = await world.post(dm["id"], "hello")
    root = await world.post(group["id"], "root")
    inner = await world.post(group["id"], "inside", thread_of=root["id"])
    await world.unread(box, alice)
    refused = await world.reply(token, dm["id"], "x", thread_of=in_dm["id"])
    assert refused.status_code == 409 and "group messages" in refused.json()["error"]["message"]
    nested = await world.reply(token, inner["room_id"], "x", thread_of=inner["id"])
    assert nested.status_code == 409
    assert f"crew reply {inner['room_id']}" in nested.json()["error"]["message"]
    user_nested = await world.client.post(
        f"/api/rooms/{inner['room_id']}/messages", json={"body": "x", "thread_of": inner["id"]}
    )
    assert user_nested.status_code == 409
    assert [m["body"] for m in await world.messages(dm["id"])] == ["hello"]
    assert [m["body"] for m in await world.messages(inner["room_id"])] == ["inside"]
