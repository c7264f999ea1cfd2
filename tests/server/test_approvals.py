"""Issue 24 on the server: each agent's permission policy (stored normalised, checked by
`crew_common.permissions`, editable, sent to its Computer) and the approvals an `ask`
rule puts to the person — a card in the room, fenced to the turn that asked, answered
once, expired by time, by the turn's end or a new connection; on both stores."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from crew_common.permissions import PermissionPolicy
from crew_harness.waiting import wait_until_async
from tests.server.test_turns import finish
from tests.server.world import Computer, World

pytestmark = pytest.mark.anyio

DEFAULT = {"preset": "autonomous", "rules": [], "ask_timeout_s": 600}
PUSH = "git push origin main"


def agent_body(handle: str, box: Computer, **more: Any) -> dict[str, Any]:
    return {"handle": handle, "name": handle.title(), "model": "m/x", "computer_id": box.id, **more}


async def computer_agent(world: World, box: Computer, agent_id: str) -> dict[str, Any]:
    agents = await world.ok("GET", "/computer/agents", headers=box.headers)
    return dict(next(a for a in agents if a["id"] == agent_id))


async def asking_turn(
    world: World, box: Computer, *, permission: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """An agent (`ada`) in a group where the user wrote, and its running turn of that
    message: (agent, room, turn)."""
    body = agent_body("ada", box, permission=permission or {"preset": "careful"})
    ada = await world.ok("POST", "/api/agents", json=body, status=201)
    room = await world.group("ops", ada)
    await world.post(room["id"], "@ada push it")
    claimed = await world.unread(box, ada)
    rooms = [
        {
            "room_id": r["room"]["id"],
            "from_seq": r["messages"][0]["seq"],
            "to_seq": r["messages"][-1]["seq"],
        }
        for r in claimed
    ]
    turn = await world.ok(
        "POST",
        f"/computer/agents/{ada['id']}/turns",
        json={"rooms": rooms, "input": "x", "engine": "opencode", "model": "m/x"},
        headers=box.headers,
        status=201,
    )
    return ada, room, turn


async def ask(
    world: World, box: Computer, turn: dict[str, Any], request_id: str = "per_1", **more: Any
) -> Any:
    body = {"request_id": request_id, "tool": "bash", "patterns": [PUSH], "summary": PUSH, **more}
    return await world.client.post(
        f"/computer/turns/{turn['turn_id']}/approvals", json=body, headers=box.headers
    )


async def poll(world: World, box: Computer, approval_id: str, wait: int = 0) -> dict[str, Any]:
    return dict(
        await world.ok("GET", f"/computer/approvals/{approval_id}?wait={wait}", headers=box.headers)
    )


async def answer(world: World, approval_id: str, decision: str) -> Any:
    return await world.client.post(f"/api/approvals/{approval_id}", json={"decision": decision})


# ------------------------------------------------------------------ the policy


async def test_an_agent_is_autonomous_by_default_in_every_record(world: World) -> None:
    box = await world.computer()
    made = await world.agent("alice", box)
    assert made["permission"] == DEFAULT
    assert (await world.ok("GET", "/api/agents"))[0]["permission"] == DEFAULT
    assert (await computer_agent(world, box, made["id"]))["permission"] == DEFAULT


async def test_a_policy_is_stored_normalised_and_a_patch_replaces_it(world: World) -> None:
    box = await world.computer()
    permission = {
        "preset": "careful",
        "rules": [
            {"tool": "bash", "pattern": "rm *", "action": "deny"},
            {"tool": "*", "pattern": "*", "action": "ask"},
        ],
        "ask_timeout_s": 120,
    }
    made = await world.ok(
        "POST", "/api/agents", json=agent_body("alice", box, permission=permission), status=201
    )
    # the `*` tool's rules first: the stored list reads as it is evaluated
    expected = PermissionPolicy.parse(permission).as_dict()
    assert made["permission"] == expected
    assert made["permission"]["rules"][0]["tool"] == "*"
    assert (await computer_agent(world, box, made["id"]))["permission"] == expected

    before = world.cursor()
    changed = await world.ok(
        "PATCH", f"/api/agents/{made['id']}", json={"permission": {"preset": "read-only"}}
    )
    assert changed["permission"] == {**DEFAULT, "preset": "read-only"}
    assert world.events(box, before) == [("agents", {"agent_id": made["id"]})]
    kept = await world.ok("PATCH", f"/api/agents/{made['id']}", json={"permission": None})
    assert kept["permission"]["preset"] == "read-only"


@pytest.mark.parametrize(
    ("permission", "reason"),
    [
        (
            {"rules": [{"tool": "bash", "pattern": "git push *"}]},
            "action must be allow, ask or deny",
        ),
        ({"rules": [{"tool": "bash", "action": "ask", "when": "x"}]}, "unknown field(s) when"),
        ({"rules": "bash: ask"}, "rules is a list"),
        ({"rules": [{"tool": "bsh", "action": "ask"}]}, "unknown tool 'bsh'"),
        (
            {"rules": [{"tool": "bash", "pattern": "^git push.*$", "action": "ask"}]},
            "looks like a regular expression",
        ),
        (
            {"rules": [{"tool": "bash", "pattern": "npm publish .+", "action": "deny"}]},
            "looks like a regular expression",
        ),
        ({"ask_timeout_s": 5}, "ask_timeout_s must be between 10 and 86400"),
        ({"ask_timeout_s": 100_000}, "ask_timeout_s must be between 10 and 86400"),
        ({"preset": "paranoid"}, "unknown preset 'paranoid'"),
    ],
)
async def test_a_policy_it_cannot_read_is_refused_with_the_reason_and_nothing_stored(
    world: World, permission: dict[str, Any], reason: str
) -> None:
    box = await world.computer()
    refused = await world.client.post(
        "/api/agents", json=agent_body("bob", box, permission=permission)
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "invalid_permission"
    assert reason in refused.json()["error"]["message"]
    assert await world.ok("GET", "/api/agents") == []

    alice = await world.agent("alice", box)
    patched = await world.client.patch(
        f"/api/agents/{alice['id']}", json={"permission": permission, "name": "Changed"}
    )
    assert patched.status_code == 422
    assert patched.json()["error"]["code"] == "invalid_permission"
    stored = (await world.ok("GET", "/api/agents"))[0]
    assert (stored["permission"], stored["name"]) == (DEFAULT, "Alice")


# ------------------------------------------------------------------ asking and answering


async def test_a_card_in_the_room_that_wakes_nobody_answered_once(world: World) -> None:
    box = await world.computer()
    ada, room, turn = await asking_turn(
        world, box, permission={"preset": "careful", "ask_timeout_s": 60}
    )
    before = world.cursor()
    created = await ask(world, box, turn)
    assert created.status_code == 201, created.text
    approval = created.json()
    assert approval["state"] == "pending"
    assert (approval["room_id"], approval["agent_id"], approval["turn_id"]) == (
        room["id"],
        ada["id"],
        turn["turn_id"],
    )
    assert approval["expires_at"] == "2026-10-05T09:01:00.000000+00:00"  # now + 60 s
    assert world.wakes(box, before) == []  # the card wakes nobody

    card = (await world.messages(room["id"]))[-1]
    assert card["id"] == approval["message_id"]
    assert card["author"]["kind"] == "system"
    assert card["body"] == f"@ada wants to run `{PUSH}`"
    assert card["approval"]["state"] == "pending"
    assert (await world.ok("GET", "/api/approvals?state=pending"))[0]["id"] == approval["id"]

    # the asking agent's reply after its card is not held for it
    token = await world.token(box, ada)
    replied = await world.reply(token, room["id"], "pushed")
    assert replied.status_code == 201, replied.text

    answered = await answer(world, approval["id"], "once")
    assert answered.status_code == 200, answered.text
    assert answered.json()["state"] == "allowed"
    assert (answered.json()["decision"], answered.json()["decided_by"]) == ("once", "user")
    assert (await poll(world, box, approval["id"]))["state"] == "allowed"
    card = next(m for m in await world.messages(room["id"]) if m["id"] == approval["message_id"])
    assert card["approval"]["decision"] == "once"
    assert await world.ok("GET", "/api/approvals?state=pending") == []

    again = await answer(world, approval["id"], "deny")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "approval_closed"
    assert "already answered" in again.json()["error"]["message"]


async def test_the_same_request_again_is_the_same_approval(world: World) -> None:
    box = await world.computer()
    _, room, turn = await asking_turn(world, box)
    first = await ask(world, box, turn)
    second = await ask(world, box, turn)
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json() == first.json()
    cards = [m for m in await world.messages(room["id"]) if m["approval"]]
    assert len(cards) == 1
    other = await ask(world, box, turn, request_id="per_2")
    assert other.status_code == 201
    assert other.json()["id"] != first.json()["id"]


async def test_a_deny_is_told_with_its_reason(world: World) -> None:
    box = await world.computer()
    _, _, turn = await asking_turn(world, box)
    approval = (await ask(world, box, turn)).json()
    denied = (await answer(world, approval["id"], "deny")).json()
    assert (denied["state"], denied["decision"]) == ("denied", "deny")
    assert denied["reason"] == "denied by the user"


async def test_always_adds_a_rule_the_user_sees_and_can_remove(world: World) -> None:
    box = await world.computer()
    ada, _, turn = await asking_turn(world, box)
    approval = (await ask(world, box, turn, always=["git push *"])).json()
    before = world.cursor()
    allowed = (await answer(world, approval["id"], "always")).json()
    assert (allowed["state"], allowed["decision"]) == ("allowed", "always")
    rule = {"tool": "bash", "pattern": "git push *", "action": "allow"}
    agent = (await world.ok("GET", "/api/agents"))[0]
    assert agent["permission"]["rules"] == [rule]
    assert (await computer_agent(world, box, ada["id"]))["permission"]["rules"] == [rule]
    assert ("agents", {"agent_id": ada["id"]}) in world.events(box, before)
    # the ask rule of the preset stays; the allow rule after it wins
    policy = PermissionPolicy.parse(agent["permission"])
    assert policy.to_opencode()["bash"]["git push *"] == "allow"

    removed = await world.ok(
        "PATCH",
        f"/api/agents/{ada['id']}",
        json={"permission": {**agent["permission"], "rules": []}},
    )
    assert removed["permission"]["rules"] == []


async def test_bad_requests_are_refused(world: World) -> None:
    box = await world.computer()
    _, _, turn = await asking_turn(world, box)
    approval = (await ask(world, box, turn)).json()
    bad = await answer(world, approval["id"], "maybe")
    assert bad.status_code == 422
    assert (await world.client.get("/api/approvals?state=open")).status_code == 422
    too_long = await world.client.get(
        f"/computer/approvals/{approval['id']}?wait=31", headers=box.headers
    )
    assert too_long.status_code == 422
    no_summary = await ask(world, box, turn, request_id="per_x", summary="")
    assert no_summary.status_code == 422
    other = await world.computer("other")
    assert (
        await world.client.get(f"/computer/approvals/{approval['id']}", headers=other.headers)
    ).status_code == 404
    assert (await poll(world, box, approval["id"]))["state"] == "pending"


# ------------------------------------------------------------------ fencing


async def test_a_finished_turn_cannot_ask_and_its_card_expires(world: World) -> None:
    box = await world.computer()
    _, _, turn = await asking_turn(world, box)
    approval = (await ask(world, box, turn)).json()
    assert (await finish(world, box, turn)).status_code == 204
    ended = await poll(world, box, approval["id"])
    assert (ended["state"], ended["reason"]) == ("expired", "the turn ended")

    late = await ask(world, box, turn, request_id="per_late")
    assert late.status_code == 409
    assert late.json()["error"]["code"] == "turn_over"
    refused = await answer(world, approval["id"], "once")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "approval_closed"
    assert "expired: the turn ended" in refused.json()["error"]["message"]


async def test_a_turn_of_an_older_epoch_cannot_ask_and_a_new_connection_expires_its_cards(
    world: World,
) -> None:
    box = await world.computer()
    _, room, turn = await asking_turn(world, box)
    approval = (await ask(world, box, turn)).json()
    await world.connect(box)  # a new Computer with the same token: epoch 2
    ended = await poll(world, box, approval["id"])
    assert ended["state"] == "expired"
    assert ended["reason"] == "the turn ended (its Computer connected again)"
    late = await ask(world, box, turn, request_id="per_2")
    assert late.status_code == 409
    assert late.json()["error"]["code"] == "turn_over"
    card = next(m for m in await world.messages(room["id"]) if m["approval"])
    assert card["approval"]["state"] == "expired"


async def test_an_answer_after_the_turn_ended_unseen_is_refused(world: World) -> None:
    box = await world.computer()
    ada, _, turn = await asking_turn(world, box)
    approval = (await ask(world, box, turn)).json()
    # the turn stops running without its finish (its next registration sweeps it)
    await world.register(box, ada)
    refused = await answer(world, approval["id"], "once")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "approval_closed"
    assert (await poll(world, box, approval["id"]))["state"] == "expired"


# ------------------------------------------------------------------ time


async def test_no_answer_in_time_expires_on_read_and_by_the_sweep(world: World) -> None:
    box = await world.computer()
    _, room, turn = await asking_turn(
        world, box, permission={"preset": "careful", "ask_timeout_s": 30}
    )
    first = (await ask(world, box, turn)).json()
    second = (await ask(world, box, turn, request_id="per_2")).json()
    world.clock.advance(29)
    assert (await poll(world, box, first["id"]))["state"] == "pending"
    world.clock.advance(1)
    expired = await poll(world, box, first["id"])
    assert (expired["state"], expired["reason"]) == ("expired", "no answer within 30 s")
    # the other one, by the sweep (nobody read it)
    assert world.store.expire_due_approvals() == 1
    assert world.store.get_approval(second["id"])["state"] == "expired"
    late = await answer(world, second["id"], "once")
    assert late.status_code == 409
    assert "expired: no answer within 30 s" in late.json()["error"]["message"]
    cards = [m for m in await world.messages(room["id"]) if m["approval"]]
    assert {c["approval"]["state"] for c in cards} == {"expired"}


async def test_a_long_poll_ends_at_the_answer(world: World) -> None:
    box = await world.computer()
    _, _, turn = await asking_turn(world, box)
    approval = (await ask(world, box, turn)).json()
    got: dict[str, Any] = {}

    async def wait() -> None:
        got.update(await poll(world, box, approval["id"], wait=20))
        got["took"] = time.monotonic() - started

    started = time.monotonic()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(wait)
        # the server answers other requests meanwhile (the wait blocks nothing)
        # the app's event hub (the store tells it of commits): the wait has subscribed
        hub = world.store.listener.__self__  # type: ignore[union-attr]
        await wait_until_async("the long poll to wait", lambda: box.id in hub.listening(), 5)
        with anyio.fail_after(5):
            assert (await world.ok("GET", "/api/approvals"))[0]["state"] == "pending"
            assert (await answer(world, approval["id"], "deny")).status_code == 200
    assert got["state"] == "denied"
    assert got["took"] < 5


async def test_a_long_poll_of_a_pending_approval_ends_after_its_wait(world: World) -> None:
    box = await world.computer()
    _, _, turn = await asking_turn(world, box)
    approval = (await ask(world, box, turn)).json()
    started = time.monotonic()
    still = await poll(world, box, approval["id"], wait=1)
    assert still["state"] == "pending"
    assert 0.9 <= time.monotonic() - started < 5
