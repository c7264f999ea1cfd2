"""Reminders: the scheduler fires them by the injectable clock; recurring ones reschedule."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from crew_harness.waiting import wait_until_async
from crew_server.clock import iso, parse_iso
from tests.server.world import Computer, World, bearer

pytestmark = pytest.mark.anyio


async def setup(world: World) -> tuple[Computer, dict[str, Any], dict[str, Any], str]:
    box = await world.computer()
    alice = await world.agent("alice", box)
    room = await world.group("launch", alice)
    return box, alice, room, await world.token(box, alice)


async def notices(world: World, room_id: str) -> list[str]:
    return [m["body"] for m in await world.messages(room_id) if m["kind"] == "notice"]


async def test_a_reminder_due_in_the_past_fires_at_once(world: World) -> None:
    box, alice, room, token = await setup(world)
    before = world.cursor()
    at = iso(world.clock.now() - timedelta(minutes=5))
    made = await world.ok(
        "POST",
        "/agent/reminders",
        headers=bearer(token),
        status=201,
        json={"room_id": room["id"], "title": "check the build", "at": at},
    )
    assert made["next_at"] == at
    # the scheduler task runs in the app's lifespan
    await wait_until_async("the reminder notice", lambda: notices(world, room["id"]), 5)
    assert await notices(world, room["id"]) == ["Reminder from @alice: check the build"]
    assert world.wakes(box, before) == [alice["id"]]
    assert await world.ok("GET", "/agent/reminders", headers=bearer(token)) == []


async def test_one_off_reminder_fires_when_the_clock_reaches_it(world: World) -> None:
    _, _, room, token = await setup(world)
    at = iso(world.clock.now() + timedelta(hours=1))
    await world.ok(
        "POST",
        "/agent/reminders",
        headers=bearer(token),
        status=201,
        json={"room_id": room["id"], "title": "stand-up", "at": at},
    )
    moved = await world.ok("POST", "/api/dev/clock", json={"advance_seconds": 1800})
    assert moved["fired"] == 0 and await notices(world, room["id"]) == []
    moved = await world.ok("POST", "/api/dev/clock", json={"advance_seconds": 1800})
    assert moved["fired"] == 1
    assert await notices(world, room["id"]) == ["Reminder from @alice: stand-up"]


async def test_recurring_reminder_reschedules_after_firing(world: World) -> None:
    box, alice, room, token = await setup(world)
    made = await world.ok(
        "POST",
        "/agent/reminders",
        headers=bearer(token),
        status=201,
        json={"room_id": room["id"], "title": "water the plants", "every": 3600},
    )
    first_due = parse_iso(made["next_at"])
    assert first_due == world.clock.now() + timedelta(hours=1)
    before = world.cursor()
    assert (await world.ok("POST", "/api/dev/clock", json={"advance_seconds": 3600}))["fired"] == 1
    [listed] = await world.ok("GET", "/agent/reminders", headers=bearer(token))
    assert parse_iso(listed["next_at"]) == first_due + timedelta(hours=1)
    # three periods pass at once: it fires once and skips to the next future time
    assert (await world.ok("POST", "/api/dev/clock", json={"advance_seconds": 3 * 3600}))[
        "fired"
    ] == 1
    [listed] = await world.ok("GET", "/agent/reminders", headers=bearer(token))
    assert parse_iso(listed["next_at"]) == first_due + timedelta(hours=4)
    assert world.wakes(box, before) == [alice["id"], alice["id"]]
    assert len(await notices(world, room["id"])) == 2


async def test_daily_and_weekly_reminders_land_on_wall_clock_times(world: World) -> None:
    _, _, room, token = await setup(world)  # the clock is Monday 2026-10-05 09:00 UTC
    daily = await world.ok(
        "POST",
        "/agent/reminders",
        headers=bearer(token),
        status=201,
        json={"room_id": room["id"], "title": "d", "daily": "08:30", "tz": "+02:00"},
    )
    assert parse_iso(daily["next_at"]) == parse_iso("2026-10-06T08:30:00+02:00")
    weekly = await world.ok(
        "POST",
        "/agent/reminders",
        headers=bearer(token),
        status=201,
        json={
            "room_id": room["id"],
            "title": "w",
            "weekly": {"day": "fri", "time": "17:00"},
            "tz": "Europe/Paris",
        },
    )
    assert parse_iso(weekly["next_at"]) == parse_iso("2026-10-09T17:00:00+02:00")
    await world.ok("POST", "/api/dev/clock", json={"advance_seconds": 86_400})
    listed = {
        r["title"]: r for r in await world.ok("GET", "/agent/reminders", headers=bearer(token))
    }
    assert parse_iso(listed["d"]["next_at"]) == parse_iso("2026-10-07T08:30:00+02:00")


async def test_reminder_requests_are_checked(world: World) -> None:
    _, _, room, token = await setup(world)
    for body in (
        {"room_id": room["id"], "title": "t"},
        {"room_id": room["id"], "title": "t", "every": 60},
        {"room_id": room["id"], "title": "t", "every": 900, "daily": "09:00"},
        {"room_id": room["id"], "title": "t", "daily": "25:00"},
        {"room_id": room["id"], "title": "t", "daily": "09:00", "tz": "not a zone!"},
    ):
        answer = await world.client.post("/agent/reminders", json=body, headers=bearer(token))
        assert answer.status_code == 422, body
        assert answer.json()["error"]["code"] == "invalid"
    unknown = {"room_id": room["id"], "title": "t", "daily": "09:00", "tz": "Mars/Olympus"}
    answer = await world.client.post("/agent/reminders", json=unknown, headers=bearer(token))
    assert answer.status_code == 409 and "unknown time zone" in answer.json()["error"]["message"]


async def test_cancel_a_reminder(world: World) -> None:
    _, _, room, token = await setup(world)
    made = await world.ok(
        "POST",
        "/agent/reminders",
        headers=bearer(token),
        status=201,
        json={"room_id": room["id"], "title": "t", "every": 900},
    )
    await world.ok("DELETE", f"/agent/reminders/{made['id']}", headers=bearer(token), status=204)
    assert await world.ok("GET", "/agent/reminders", headers=bearer(token)) == []
    gone = await world.client.delete(f"/agent/reminders/{made['id']}", headers=bearer(token))
    assert gone.status_code == 404


async def test_a_reminder_wakes_only_its_agent_and_stays_its_own(world: World) -> None:
    box = await world.computer()
    alice, bob = await world.agent("alice", box), await world.agent("bob", box)
    group = await world.group("launch", alice, bob)
    elsewhere = await world.group("elsewhere", bob)
    alice_token, bob_token = await world.token(box, alice), await world.token(box, bob)
    body = {"room_id": group["id"], "title": "ship it", "every": 900}
    made = await world.ok(
        "POST", "/agent/reminders", headers=bearer(alice_token), status=201, json=body
    )
    assert made["agent_id"] == alice["id"] and made["every"] == 900
    assert await world.ok("GET", "/agent/reminders", headers=bearer(bob_token)) == []
    gone = await world.client.delete(f"/agent/reminders/{made['id']}", headers=bearer(bob_token))
    assert gone.status_code == 404
    foreign = await world.client.post(
        "/agent/reminders",
        headers=bearer(alice_token),
        json={**body, "room_id": elsewhere["id"]},
    )
    assert foreign.status_code == 403
    before = world.cursor()
    assert (await world.ok("POST", "/api/dev/clock", json={"advance_seconds": 900}))["fired"] == 1
    assert world.wakes(box, before) == [alice["id"]]  # not bob, though the notice is in his group
    [notice] = [m for m in await world.messages(group["id"]) if m["kind"] == "notice"]
    assert notice["body"] == "Reminder from @alice: ship it"
    assert notice["author"] == {"kind": "system", "id": "system", "name": "Crew", "handle": None}
