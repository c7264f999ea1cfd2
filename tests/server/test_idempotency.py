"""`Idempotency-Key` on agent writes: done once per key, agent and turn (both backends)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.server.world import World, bearer

pytestmark = pytest.mark.anyio


async def keyed_reply(
    world: World, token: str, room_id: str, body: str, key: str
) -> httpx.Response:
    headers = {**bearer(token), "Idempotency-Key": key}
    payload: dict[str, Any] = {"room_id": room_id, "body": body}
    return await world.client.post("/agent/reply", json=payload, headers=headers)


async def test_the_same_key_again_gets_the_first_answer_and_posts_once(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    token = await world.token(box, alice)
    await world.register(box, alice)
    first = await keyed_reply(world, token, room["id"], "Done.", "k1")
    again = await keyed_reply(world, token, room["id"], "Done.", "k1")
    assert first.status_code == again.status_code == 201, again.text
    assert again.json() == first.json()
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert [m["body"] for m in await world.messages(room["id"])] == ["Done."]


async def test_a_key_reused_for_another_body_is_refused_and_posts_nothing(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    token = await world.token(box, alice)
    assert (await keyed_reply(world, token, room["id"], "one", "k")).status_code == 201
    other = await keyed_reply(world, token, room["id"], "two", "k")
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert "different request" in other.json()["error"]["message"]
    assert [m["body"] for m in await world.messages(room["id"])] == ["one"]


async def test_a_held_reply_does_not_take_its_key(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.group("launch", alice)
    token = await world.token(box, alice)
    await world.post(room["id"], "first")
    await world.unread(box, alice)
    await world.post(room["id"], "one more thing")
    held = await keyed_reply(world, token, room["id"], "Done.", "k")
    assert held.status_code == 409 and held.json()["held"] is True
    sent = await keyed_reply(world, token, room["id"], "Done.", "k")
    assert sent.status_code == 201, sent.text
    assert [m["body"] for m in await world.messages(room["id"])][-1] == "Done."


async def test_the_same_key_in_a_later_turn_is_a_new_write(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    token = await world.token(box, alice)
    await world.register(box, alice)
    assert (await keyed_reply(world, token, room["id"], "ok", "k")).status_code == 201
    await world.register(box, alice)  # a new turn (the old one is interrupted)
    later = await keyed_reply(world, token, room["id"], "ok", "k")
    assert later.status_code == 201 and "Idempotent-Replayed" not in later.headers
    assert [m["body"] for m in await world.messages(room["id"])] == ["ok", "ok"]


async def test_a_task_claim_with_the_same_key_is_done_once(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.group("launch", alice)
    token = await world.token(box, alice)
    headers = {**bearer(token), "Idempotency-Key": "create"}
    payload = {"room_id": room["id"], "title": "Ship it"}
    first = await world.client.post("/agent/tasks", json=payload, headers=headers)
    again = await world.client.post("/agent/tasks", json=payload, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    tasks = await world.client.get(
        "/agent/tasks", params={"room_id": room["id"]}, headers=bearer(token)
    )
    assert [t["title"] for t in tasks.json()] == ["Ship it"]


async def test_a_bad_key_is_refused_with_what_to_send(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    token = await world.token(box, alice)
    bad = await keyed_reply(world, token, room["id"], "hi", "x" * 201)
    assert bad.status_code == 400 and "Idempotency-Key" in bad.json()["error"]["message"]
    assert await world.messages(room["id"]) == []
