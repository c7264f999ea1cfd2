"""Issue 24 on the server: budgets per agent. The caps are stored and checked (422
`invalid_budget`, nothing stored), what a turn spent counts (the gateway's tokens over the
engine's), the claim holds an agent at its cap (messages stay unread, `paused` says why),
the 80 % and 100 % notices go once per period, and raising the cap, resuming once and the
period's end (the server's test clock) let it go on, with a wake; on both stores."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.world import Computer, World, turn_registration

pytestmark = pytest.mark.anyio

NO_BUDGET = {"daily_usd": None, "monthly_usd": None, "monthly_tokens": None}


async def budgeted(world: World, box: Computer, budget: Any, handle: str = "ada") -> Any:
    body = {"handle": handle, "name": "Ada", "model": "m/x", "computer_id": box.id}
    return await world.ok("POST", "/api/agents", json={**body, "budget": budget}, status=201)


async def claim(world: World, box: Computer, agent: dict[str, Any]) -> dict[str, Any]:
    return dict(
        await world.ok("POST", f"/computer/agents/{agent['id']}/unread", headers=box.headers)
    )


async def turn(
    world: World,
    box: Computer,
    agent: dict[str, Any],
    usage: dict[str, Any],
    gateway: dict[str, Any] | None = None,
) -> None:
    """One whole turn of `agent`: claim, register, ack, finish with `usage` (the runner's order)."""
    rooms = (await claim(world, box, agent))["rooms"]
    assert rooms, "the turn had nothing to answer"
    body = turn_registration(rooms)
    path = f"/computer/agents/{agent['id']}/turns"
    registered = await world.ok("POST", path, json=body, headers=box.headers, status=201)
    ack = {"turn_id": registered["turn_id"], "fence": registered["fence"]}
    await world.ok("POST", f"/computer/agents/{agent['id']}/ack", json=ack, headers=box.headers)
    finish: dict[str, Any] = {"fence": registered["fence"], "status": "succeeded", "usage": usage}
    if gateway is not None:
        finish["gateway_usage"] = gateway
    await world.ok(
        "POST", f"/computer/turns/{registered['turn_id']}/finish", json=finish, headers=box.headers
    )


def cost(usd: float) -> dict[str, Any]:
    return {"input_tokens": 10, "output_tokens": 5, "cost": usd}


async def shown(world: World, agent: dict[str, Any]) -> dict[str, Any]:
    return next(a for a in await world.ok("GET", "/api/agents") if a["id"] == agent["id"])


async def notices(world: World, room_id: str) -> list[str]:
    return [m["body"] for m in await world.messages(room_id) if m["kind"] == "notice"]


async def test_no_budget_by_default_and_caps_are_stored_as_given(world: World) -> None:
    box = await world.computer()
    plain = await world.agent("bob", box)
    assert plain["budget"] == NO_BUDGET
    listed = await shown(world, plain)
    assert listed["budget_state"] is None and listed["status"] == "idle"

    ada = await budgeted(world, box, {"daily_usd": 5, "monthly_tokens": 1000})
    assert ada["budget"] == {"daily_usd": 5.0, "monthly_usd": None, "monthly_tokens": 1000}
    state = (await shown(world, ada))["budget_state"]
    assert state == {
        "held": False,
        "until": None,
        "detail": None,
        "spent": {"daily_usd": 0.0, "monthly_usd": None, "monthly_tokens": 0},
        "resume_once": False,
    }
    # null leaves it; {} (or all null) removes it
    kept = await world.ok("PATCH", f"/api/agents/{ada['id']}", json={"budget": None})
    assert kept["budget"]["daily_usd"] == 5.0
    gone = await world.ok("PATCH", f"/api/agents/{ada['id']}", json={"budget": {}})
    assert gone["budget"] == NO_BUDGET


@pytest.mark.parametrize(
    ("budget", "reason"),
    [
        ({"daily_usd": -1}, "daily_usd cannot be below zero"),
        ({"monthly_usd": "5"}, "monthly_usd must be a number or null"),
        ({"monthly_tokens": 1.5}, "monthly_tokens must be a whole number"),
        ({"monthly_tokens": True}, "monthly_tokens must be a number or null"),
        ({"daily": 5}, "a budget has no field daily"),
        ({"daily_usd": 1e13}, "daily_usd must be at most"),
        ([5], "a budget is an object"),
        (5, "a budget is an object"),
    ],
)
async def test_a_budget_it_cannot_take_is_refused_with_the_reason_and_nothing_stored(
    world: World, budget: Any, reason: str
) -> None:
    box = await world.computer()
    body = {"handle": "ada", "name": "Ada", "model": "m/x", "computer_id": box.id}
    refused = await world.client.post("/api/agents", json={**body, "budget": budget})
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["code"] == "invalid_budget" and reason in error["message"], error
    assert await world.ok("GET", "/api/agents") == []

    ada = await budgeted(world, box, {"daily_usd": 5})
    patched = await world.client.patch(
        f"/api/agents/{ada['id']}", json={"budget": budget, "name": "Changed"}
    )
    assert patched.status_code == 422 and patched.json()["error"]["code"] == "invalid_budget"
    after = await shown(world, ada)
    assert after["budget"]["daily_usd"] == 5.0 and after["name"] == "Ada"


async def test_nan_is_refused(world: World) -> None:
    body = b'{"handle": "ada", "name": "Ada", "model": "m/x", "budget": {"daily_usd": NaN}}'
    refused = await world.client.post(
        "/api/agents", content=body, headers={"content-type": "application/json"}
    )
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert (
        error["code"] == "invalid_budget"
        and "daily_usd must be a finite number" in (error["message"])
    )
    assert await world.ok("GET", "/api/agents") == []


async def test_at_its_cap_the_claim_is_empty_the_messages_unread_and_one_notice_each(
    world: World,
) -> None:
    box = await world.computer()
    ada = await budgeted(world, box, {"daily_usd": 5})
    room = await world.dm(ada)
    await world.post(room["id"], "one")
    await turn(world, box, ada, cost(3.0))
    assert await notices(world, room["id"]) == []  # 60 %: nothing yet

    await world.post(room["id"], "two")
    await turn(world, box, ada, cost(1.5))  # 90 %
    warned = await notices(world, room["id"])
    assert (
        len(warned) == 1 and "@ada has used 90% of its daily budget ($4.50 of $5.00)" in (warned[0])
    )

    await world.post(room["id"], "three")
    await turn(world, box, ada, cost(0.6))  # 102 %: the turn that crossed is not undone
    after = await notices(world, room["id"])
    assert len(after) == 2
    assert after[1].startswith("@ada reached its daily budget ($5.00); its messages wait until")
    assert "00:00 UTC on 2026-10-06" in after[1]

    await world.post(room["id"], "four")
    answer = await claim(world, box, ada)
    assert answer["rooms"] == [] and answer["more"] is False
    paused = answer["paused"]
    assert paused["reason"] == "budget" and paused["until"] == "2026-10-06T00:00:00.000000+00:00"
    assert "daily budget $5.10 of $5.00" in paused["detail"]
    # not delivered, not read: the message waits
    last = (await world.messages(room["id"]))[-1]
    assert last["body"] == "four"
    delivered, read = (await world.positions(ada))[room["id"]]
    assert delivered < last["seq"] and read < last["seq"]

    # claimed again (another Computer, a restart): still held, and no second notice
    assert (await claim(world, box, ada))["paused"] is not None
    await world.post(room["id"], "five")
    assert (await claim(world, box, ada))["rooms"] == []
    assert len(await notices(world, room["id"])) == 2

    state = await shown(world, ada)
    assert state["status"] == "budget"
    assert state["budget_state"]["held"] is True
    assert state["budget_state"]["until"] == "2026-10-06T00:00:00.000000+00:00"


async def test_a_notice_wakes_no_one(world: World) -> None:
    box = await world.computer()
    ada = await budgeted(world, box, {"daily_usd": 1})
    bob = await world.agent("bob", box)
    group = await world.group("team", ada, bob)
    await world.post(group["id"], "hello")
    await turn(world, box, bob, cost(0))
    before = world.cursor()
    await turn(world, box, ada, cost(2.0))
    assert len(await notices(world, group["id"])) == 1
    assert world.wakes(box, before) == []


async def test_raising_the_cap_wakes_the_agent_and_its_claim_gives_the_messages(
    world: World,
) -> None:
    box = await world.computer()
    ada = await budgeted(world, box, {"monthly_usd": 2})
    room = await world.dm(ada)
    await world.post(room["id"], "one")
    await turn(world, box, ada, cost(2.5))
    await world.post(room["id"], "two")
    assert (await claim(world, box, ada))["paused"]["until"] == "2026-11-01T00:00:00.000000+00:00"

    before = world.cursor()
    await world.ok("PATCH", f"/api/agents/{ada['id']}", json={"budget": {"monthly_usd": 10}})
    assert world.wakes(box, before) == [ada["id"]]
    answer = await claim(world, box, ada)
    assert "paused" not in answer
    assert [m["body"] for m in answer["rooms"][0]["messages"]][-1] == "two"
    assert (await shown(world, ada))["status"] == "idle"


async def test_resume_once_lets_exactly_one_turn_through(world: World) -> None:
    box = await world.computer()
    ada = await budgeted(world, box, {"daily_usd": 1})
    room = await world.dm(ada)
    await world.post(room["id"], "one")
    await turn(world, box, ada, cost(1.0))
    await world.post(room["id"], "two")
    assert (await claim(world, box, ada))["rooms"] == []

    before = world.cursor()
    resumed = await world.ok("POST", f"/api/agents/{ada['id']}/budget/resume")
    assert resumed["budget_state"]["resume_once"] is True
    assert resumed["budget_state"]["held"] is True  # the cap is still reached
    # twice before the turn ran is still one turn
    await world.ok("POST", f"/api/agents/{ada['id']}/budget/resume")
    assert world.wakes(box, before) == [ada["id"], ada["id"]]

    await turn(world, box, ada, cost(0.5))  # the one turn
    await world.post(room["id"], "three")
    answer = await claim(world, box, ada)
    assert answer["rooms"] == [] and answer["paused"]["reason"] == "budget"
    assert (await shown(world, ada))["budget_state"]["resume_once"] is False
    # one 100 % notice in the period, even after the resumed turn
    assert sum("reached" in n for n in await notices(world, room["id"])) == 1


async def test_resuming_an_unknown_agent_is_404(world: World) -> None:
    missing = await world.client.post(
        "/api/agents/00000000-0000-4000-8000-000000000000/budget/resume"
    )
    assert missing.status_code == 404


async def test_the_next_day_wakes_the_held_agent_and_its_turns_resume(world: World) -> None:
    box = await world.computer()
    ada = await budgeted(world, box, {"daily_usd": 1, "monthly_usd": 100})
    room = await world.dm(ada)
    await world.post(room["id"], "one")
    await turn(world, box, ada, cost(1.2))
    await world.post(room["id"], "two")
    assert (await claim(world, box, ada))["paused"] is not None
    assert world.store.next_budget_release_at() is not None

    before = world.cursor()
    # 09:00 → 23:59: still the same UTC day, nothing released
    await world.ok("POST", "/api/dev/clock", json={"advance_seconds": 14 * 3600 + 59 * 60})
    assert world.wakes(box, before) == []
    await world.ok("POST", "/api/dev/clock", json={"advance_seconds": 60})
    assert world.wakes(box, before) == [ada["id"]]
    answer = await claim(world, box, ada)
    assert "paused" not in answer and answer["rooms"][0]["messages"][-1]["body"] == "two"
    state = (await shown(world, ada))["budget_state"]
    assert state["spent"] == {"daily_usd": 0.0, "monthly_usd": 1.2, "monthly_tokens": None}
    assert world.store.next_budget_release_at() is None


async def test_the_gateway_tokens_count_over_the_engine_tokens(world: World) -> None:
    box = await world.computer()
    ada = await budgeted(world, box, {"monthly_tokens": 1000})
    room = await world.dm(ada)
    engine = {"input_tokens": 100, "output_tokens": 50, "reasoning_tokens": 10, "cost": 0.0}
    gateway = {"requests": 2, "input_tokens": 700, "output_tokens": 200}
    await world.post(room["id"], "one")
    await turn(world, box, ada, engine, gateway)
    spent = (await shown(world, ada))["budget_state"]["spent"]["monthly_tokens"]
    assert spent == 900  # the gateway's (it saw the title call too), not 160
    await world.post(room["id"], "two")
    await turn(world, box, ada, engine)  # no gateway: the engine's input + output + reasoning
    assert (await shown(world, ada))["budget_state"]["spent"]["monthly_tokens"] == 1060
    assert "monthly token budget" in (await notices(world, room["id"]))[-1]
    await world.post(room["id"], "three")
    assert (await claim(world, box, ada))["paused"]["until"] == "2026-11-01T00:00:00.000000+00:00"


async def test_a_zero_cap_holds_at_once_and_a_budget_of_another_agent_does_not(
    world: World,
) -> None:
    box = await world.computer()
    ada = await budgeted(world, box, {"daily_usd": 0})
    bob = await world.agent("bob", box)
    group = await world.group("team", ada, bob)
    await world.post(group["id"], "hello")
    held = await claim(world, box, ada)
    assert held["rooms"] == [] and held["paused"]["reason"] == "budget"
    assert (await claim(world, box, bob))["rooms"][0]["messages"][0]["body"] == "hello"
    # the hold's notice goes to the room whose messages wait
    assert any(
        "@ada reached its daily budget ($0.00)" in n for n in await notices(world, group["id"])
    )
