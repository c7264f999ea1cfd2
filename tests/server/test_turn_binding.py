"""The turn identity (issue 22): each agent write counts for the turn whose `crew` sent it.

Registering a turn answers a secret; `crew` sends it as `Crew-Turn`. Refused, not
ignored: an identity of no turn of the calling agent (made up, another agent's) — 403
`wrong_turn`, nothing done; binding it anywhere would acknowledge rooms for a turn that
did not answer them, and an honest `crew` never holds one. A write of an older turn of
the same agent binds to that turn (a late reply is exactly that) and acknowledges what it
answered; once a newer turn has claimed the messages it is refused (409 `turn_over`),
because the newer turn answers them. Both stores (the `world` fixture runs each test on
SQLite and PostgreSQL).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.server.test_answered_ack import finish
from tests.server.test_delivery_edges import claimed_turn
from tests.server.world import Computer, World, bearer

pytestmark = pytest.mark.anyio


async def reply(
    world: World, token: str, room_id: str, body: str, turn: dict[str, Any] | str | None
) -> httpx.Response:
    """`crew reply` as it goes out: the agent's token, the turn's identity (or a given one)."""
    headers = bearer(token)
    if turn is not None:
        headers["Crew-Turn"] = turn if isinstance(turn, str) else turn["turn_secret"]
    return await world.client.post(
        "/agent/reply", json={"room_id": room_id, "body": body}, headers=headers
    )


def turn_of_message(world: World, message_id: str) -> str | None:
    """The turn a message is recorded for (`messages.turn_id`), read from the database."""
    with world.store._database.read() as tx:
        row = tx.execute("SELECT turn_id FROM messages WHERE id = ?", (message_id,)).fetchone()
    return None if row["turn_id"] is None else str(row["turn_id"])


async def setup(world: World) -> tuple[Computer, dict[str, Any], dict[str, Any], str]:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.dm(alice)
    return box, alice, room, await world.token(box, alice)


async def test_register_answers_a_secret_each_turn_and_a_reply_records_its_turn(
    world: World,
) -> None:
    box, alice, room, token = await setup(world)
    await world.post(room["id"], "a question")
    turn = await claimed_turn(world, box, alice)
    assert turn["turn_secret"].startswith("crt_") and len(turn["turn_secret"]) > 40
    sent = await reply(world, token, room["id"], "the answer", turn)
    assert sent.status_code == 201, sent.text
    assert turn_of_message(world, sent.json()["message_id"]) == turn["turn_id"]
    # Only its hash is kept.
    with world.store._database.read() as tx:
        stored = tx.execute(
            "SELECT secret_hash FROM turns WHERE id = ?", (turn["turn_id"],)
        ).fetchone()
    assert stored["secret_hash"] and turn["turn_secret"] not in stored["secret_hash"]
    await world.post(room["id"], "and another")
    second = await claimed_turn(world, box, alice)
    assert second["turn_secret"] != turn["turn_secret"]


@pytest.mark.parametrize("forged", ["crt_made_up", "x"])
async def test_a_made_up_turn_identity_is_refused_and_nothing_is_posted(
    world: World, forged: str
) -> None:
    box, alice, room, token = await setup(world)
    await world.post(room["id"], "a question")
    await claimed_turn(world, box, alice)
    sent = await reply(world, token, room["id"], "the answer", forged)
    assert sent.status_code == 403 and sent.json()["error"]["code"] == "wrong_turn", sent.text
    assert [m["body"] for m in await world.messages(room["id"])] == ["a question"]


async def test_another_agents_turn_identity_is_refused_and_binds_nothing(world: World) -> None:
    box, alice, room, token = await setup(world)
    bob = await world.agent("bob", box)
    bob_room = await world.dm(bob)
    await world.post(room["id"], "for alice")
    await world.post(bob_room["id"], "for bob")
    await claimed_turn(world, box, alice)
    bobs = await claimed_turn(world, box, bob)
    # Alice's token with Bob's turn: refused, Bob's turn answered nothing.
    sent = await reply(world, token, room["id"], "alice speaking", bobs)
    assert sent.status_code == 403 and sent.json()["error"]["code"] == "wrong_turn", sent.text
    await finish(world, box, bobs, "failed")
    assert (await world.positions(bob))[bob_room["id"]] == (1, 0)
    assert [m["body"] for m in await world.messages(room["id"])] == ["for alice"]


async def test_a_reply_landing_after_its_turn_failed_attaches_to_it_and_acks(
    world: World,
) -> None:
    box, alice, room, token = await setup(world)
    await world.post(room["id"], "a question")
    turn = await claimed_turn(world, box, alice)
    await finish(world, box, turn, "failed")  # crew reply timed out: reply_refused
    assert (await world.positions(alice))[room["id"]] == (1, 0)  # nothing answered yet
    late = await reply(world, token, room["id"], "late answer", turn)
    assert late.status_code == 201, late.text
    assert turn_of_message(world, late.json()["message_id"]) == turn["turn_id"]
    assert (await world.positions(alice))[room["id"]] == (2, 2)
    assert await world.unread(box, alice) == []


async def test_a_late_reply_once_a_newer_turn_has_the_messages_is_refused(
    world: World,
) -> None:
    box, alice, room, token = await setup(world)
    await world.post(room["id"], "a question")
    first = await claimed_turn(world, box, alice)
    await finish(world, box, first, "failed")
    second = await claimed_turn(world, box, alice)  # the retry has the question again
    late = await reply(world, token, room["id"], "late answer", first)
    assert late.status_code == 409 and late.json()["error"]["code"] == "turn_over", late.text
    sent = await reply(world, token, room["id"], "the answer", second)
    assert sent.status_code == 201, sent.text
    bodies = [m["body"] for m in await world.messages(room["id"])]
    assert bodies == ["a question", "the answer"]  # answered once


@pytest.mark.parametrize("status", ["failed", "cancelled"])
async def test_a_turn_that_ended_unacked_acks_only_the_rooms_it_answered_by_its_identity(
    world: World, status: str
) -> None:
    """Failed, or stopped (`cancelled`: the person's Stop, the Computer shutting down)
    after it answered one room: that room is not asked again, the other stays unread."""
    box, alice, answered, token = await setup(world)
    silent = await world.group("quiet", alice)
    await world.post(answered["id"], "a question")
    await world.post(silent["id"], "another")
    turn = await claimed_turn(world, box, alice)
    assert (await reply(world, token, answered["id"], "the answer", turn)).status_code == 201
    await finish(world, box, turn, status)
    positions = await world.positions(alice)
    assert positions[answered["id"]] == (2, 2)
    assert positions[silent["id"]] == (1, 0)  # unanswered: unread, as before
    assert [r["room"]["id"] for r in await world.unread(box, alice)] == [silent["id"]]


async def test_a_turn_still_running_at_the_next_claim_is_swept_and_acks_what_it_answered(
    world: World,
) -> None:
    box, alice, room, token = await setup(world)
    await world.post(room["id"], "a question")
    turn = await claimed_turn(world, box, alice)
    assert (await reply(world, token, room["id"], "the answer", turn)).status_code == 201
    # Its finish never arrived; the runner claims for its next turn.
    assert await world.unread(box, alice) == []
    [swept] = await world.ok("GET", f"/api/turns?agent_id={alice['id']}")
    assert swept["status"] == "interrupted"


async def test_the_same_key_in_another_turn_is_a_new_write(world: World) -> None:
    box, alice, room, token = await setup(world)
    await world.post(room["id"], "first")
    first = await claimed_turn(world, box, alice)
    body = {"room_id": room["id"], "body": "ok"}
    headers = {**bearer(token), "Idempotency-Key": "crew-same", "Crew-Turn": first["turn_secret"]}
    assert (await world.client.post("/agent/reply", json=body, headers=headers)).status_code == 201
    again = await world.client.post("/agent/reply", json=body, headers=headers)
    assert again.headers.get("Idempotent-Replayed") == "true"
    await finish(world, box, first, "succeeded")
    await world.post(room["id"], "second")
    second = await claimed_turn(world, box, alice)
    headers["Crew-Turn"] = second["turn_secret"]
    assert (await world.client.post("/agent/reply", json=body, headers=headers)).status_code == 201
    assert [m["body"] for m in await world.messages(room["id"])] == ["first", "ok", "second", "ok"]


async def test_an_identity_of_a_turn_that_ended_over_48_hours_ago_binds_nothing(
    world: World,
) -> None:
    box, alice, room, token = await setup(world)
    await world.post(room["id"], "a question")
    turn = await claimed_turn(world, box, alice)
    await finish(world, box, turn, "failed")
    world.clock.advance(48 * 3600 + 1)
    late = await reply(world, token, room["id"], "far too late", turn)
    assert late.status_code == 403 and late.json()["error"]["code"] == "wrong_turn", late.text


async def test_a_reply_without_an_identity_counts_for_the_latest_turn(world: World) -> None:
    box, alice, room, token = await setup(world)
    await world.post(room["id"], "a question")
    turn = await claimed_turn(world, box, alice)
    sent = await reply(world, token, room["id"], "from an older crew", None)
    assert sent.status_code == 201, sent.text
    assert turn_of_message(world, sent.json()["message_id"]) == turn["turn_id"]


async def test_what_held_showed_before_the_turns_reply_is_read_with_its_claim(
    world: World,
) -> None:
    """Chaos seed 2: a reply HELD (it showed #2), sent again and posted (#3), then the
    Computer was killed: the server's ack read only the claim (#1), so #2 was answered
    again by the next turn. The turn saw everything up to its post: all of it is read."""
    box, alice, room, token = await setup(world)
    await world.post(room["id"], "a question")
    turn = await claimed_turn(world, box, alice)
    await world.post(room["id"], "and one more thing")
    held = await reply(world, token, room["id"], "the answer", turn)
    assert held.status_code == 409 and held.json()["held"] is True, held.text
    assert (await reply(world, token, room["id"], "both answered", turn)).status_code == 201
    await finish(world, box, turn, "failed")  # as the sweep after a kill -9 does
    assert (await world.positions(alice))[room["id"]] == (3, 3)
    assert await world.unread(box, alice) == []
    # What came after the post stays unread for the next turn.
    await world.post(room["id"], "a new question")
    [unread] = await world.unread(box, alice)
    assert [m["body"] for m in unread["messages"]] == ["a new question"]
