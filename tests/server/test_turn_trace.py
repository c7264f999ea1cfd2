"""A turn's trace (issue 26): the Computer's steps come with the finish, the server adds
when the turn's first reply reached it and was stored; the turn record shows both."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.world import World

pytestmark = pytest.mark.anyio

COMPUTER_STEPS = {
    "post": 1_000,
    "wake": 1_010,
    "claimed": 1_020,
    "registered": 1_030,
    "server_ready": 1_031,
    "engine_accepted": 1_040,
    "first_token": 1_100,
    "acked": 1_300,
}


async def finish(world: World, box: Any, turn: dict[str, Any], **extra: Any) -> Any:
    body = {"fence": turn["fence"], "status": "succeeded", **extra}
    return await world.client.post(
        f"/computer/turns/{turn['turn_id']}/finish", json=body, headers=box.headers
    )


async def test_the_first_reply_and_the_computers_steps_make_the_turns_trace(
    world: World,
) -> None:
    box = await world.computer()
    ada = await world.agent("ada", box)
    room = await world.dm(ada)
    await world.post(room["id"], "hi")
    token = await world.token(box, ada)
    await world.unread(box, ada)
    turn = await world.register(box, ada)
    before = int(world.clock.now().timestamp() * 1000)
    first = await world.reply(token, room["id"], "hello")
    assert first.status_code == 201, first.text
    world.clock.advance(5)
    second = await world.reply(token, room["id"], "and more")
    assert second.status_code == 201, second.text
    answer = await finish(world, box, turn, trace=COMPUTER_STEPS)
    assert answer.status_code == 204, answer.text

    shown = await world.ok("GET", f"/api/turns/{turn['turn_id']}")
    trace = shown["trace"]
    # The first reply's times, by the server's (frozen) clock; the later one changed nothing.
    assert trace["reply_received"] == before
    assert trace["reply_stored"] == before
    assert {k: v for k, v in trace.items() if not k.startswith("reply_")} == COMPUTER_STEPS
    listed = await world.ok("GET", "/api/turns", params={"agent_id": ada["id"]})
    assert listed[0]["trace"] == trace


async def test_a_turn_without_a_trace_shows_none_and_a_computer_cannot_write_the_servers_steps(
    world: World,
) -> None:
    box = await world.computer()
    ada = await world.agent("ada", box)
    turn = await world.register(box, ada)
    refused = await finish(world, box, turn, trace={"reply_stored": 5})
    assert refused.status_code == 422, refused.text
    unknown = await finish(world, box, turn, trace={"lunch": 5})
    assert unknown.status_code == 422, unknown.text
    negative = await finish(world, box, turn, trace={"post": -1})
    assert negative.status_code == 422, negative.text
    done = await finish(world, box, turn)
    assert done.status_code == 204, done.text
    shown = await world.ok("GET", f"/api/turns/{turn['turn_id']}")
    assert shown["trace"] is None


async def test_a_held_reply_is_not_the_turns_reply(world: World) -> None:
    box = await world.computer()
    ada = await world.agent("ada", box)
    room = await world.dm(ada)
    await world.post(room["id"], "one")
    token = await world.token(box, ada)
    await world.unread(box, ada)
    turn = await world.register(box, ada)
    await world.post(room["id"], "two")  # the agent has not seen it: its reply is held
    held = await world.reply(token, room["id"], "answer to one")
    assert held.status_code == 409, held.text
    world.clock.advance(2)
    posted_at = int(world.clock.now().timestamp() * 1000)
    sent = await world.reply(token, room["id"], "answer to both")
    assert sent.status_code == 201, sent.text
    assert (await finish(world, box, turn)).status_code == 204
    shown = await world.ok("GET", f"/api/turns/{turn['turn_id']}")
    assert shown["trace"] == {"reply_received": posted_at, "reply_stored": posted_at}
