"""Prewarm hints (issue 26), in-process: opening a room page or typing in it sends
`prewarm {"agent_ids": [...]}` to the Computers of the room's agents, at most once per
agent per period, CSRF-checked, and never a wake (a hint starts no turn)."""

from __future__ import annotations

from typing import Any

import pytest

from crew_server.api.stream import PREWARM_EVERY_S, EventHub, PrewarmHints
from tests.server import test_stop_wake
from tests.server.test_stop_wake import Stage
from tests.server.world import Computer, World

pytestmark = pytest.mark.anyio

stage = test_stop_wake.stage  # the fixture: a world, its event hub, a browser


def prewarms(world: World, box: Computer, cursor: int) -> list[list[str]]:
    """The agent ids of each event on the Computer's stream since `cursor` (prewarms only;
    any other event fails: a hint must not come with a wake)."""
    events = world.events(box, cursor)
    assert all(event == "prewarm" for event, _ in events), events
    return [data["agent_ids"] for _, data in events]


async def test_opening_a_room_page_hints_its_agents_once_per_period(stage: Stage) -> None:
    world = stage.world
    box = await stage.connected()
    other = await stage.connected("other")
    ada, bea = await world.agent("ada", box), await world.agent("bea", box)
    cal = await world.agent("cal", other)
    homeless = await world.agent("dee", None)
    group = await world.group("crew", ada, bea, cal, homeless)
    await stage.signed_in()
    cursor = world.cursor()
    page = await stage.browser.get(f"/rooms/{group['id']}")
    assert page.status_code == 200
    assert prewarms(world, box, cursor) == [sorted([ada["id"], bea["id"]])]
    assert prewarms(world, other, cursor) == [[cal["id"]]]
    cursor = world.cursor()
    await stage.browser.get(f"/rooms/{group['id']}")  # again, within the period: nothing
    dm = await world.dm(ada)
    await stage.browser.get(f"/rooms/{dm['id']}")  # @ada hinted already, also from here
    assert world.events(box, cursor) == [] and world.events(other, cursor) == []


async def test_typing_posts_a_hint_that_needs_the_csrf_token(stage: Stage) -> None:
    world = stage.world
    box = await stage.connected()
    ada = await world.agent("ada", box)
    room = await world.dm(ada)
    csrf = await stage.signed_in()
    path = f"/rooms/{room['id']}/prewarm"
    cursor = world.cursor()
    for data in ({}, {"csrf": csrf[:-2] + "xx"}):
        answer = await stage.browser.post(path, data=data, headers={"X-Crew-Fetch": "1"})
        assert answer.status_code == 403 and "CSRF" in answer.text
    assert world.events(box, cursor) == []
    answer = await stage.browser.post(path, data={"csrf": csrf}, headers={"X-Crew-Fetch": "1"})
    assert answer.status_code == 204, answer.text
    assert prewarms(world, box, cursor) == [[ada["id"]]]
    # Without the script's header (a plain form post) it goes back to the room.
    answer = await stage.browser.post(path, data={"csrf": csrf})
    assert answer.status_code == 303 and answer.headers["location"] == f"/rooms/{room['id']}"
    missing = "00000000-0000-4000-8000-000000000000"
    answer = await stage.browser.post(
        f"/rooms/{missing}/prewarm", data={"csrf": csrf}, headers={"X-Crew-Fetch": "1"}
    )
    assert answer.status_code == 404
    # A hint is not a message: nothing to claim, no turn.
    assert await world.unread(box, ada) == []


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_hint_is_rate_limited_per_agent_and_only_to_listening_computers(
    stage: Stage,
) -> None:
    world = stage.world
    box = await stage.connected()
    away = await world.computer("away")  # connected once, no stream open now
    ada, bea = await world.agent("ada", box), await world.agent("bea", away)
    room = await world.group("crew", ada, bea)
    clock = Clock()
    hints = PrewarmHints(clock=clock)
    hub: EventHub = stage.hub
    cursor = world.cursor()
    sqlite = world.store.dialect == "sqlite"
    hinted = [ada["id"]] if sqlite else sorted([ada["id"], bea["id"]])
    assert sorted(hints.hint_room(world.store, hub, room["id"])) == hinted
    clock.now += PREWARM_EVERY_S - 1
    assert hints.hint_room(world.store, hub, room["id"]) == []
    clock.now += 1
    assert sorted(hints.hint_room(world.store, hub, room["id"])) == hinted
    assert prewarms(world, box, cursor) == [[ada["id"]], [ada["id"]]]
    # On SQLite a Computer without an open stream hears nothing (one process knows);
    # on PostgreSQL its stream may be open on another process.
    assert prewarms(world, away, cursor) == ([] if sqlite else [[bea["id"]], [bea["id"]]])


async def test_a_room_without_agents_on_a_computer_sends_nothing(stage: Stage) -> None:
    world = stage.world
    box = await stage.connected()
    homeless = await world.agent("dee", None)
    room: dict[str, Any] = await world.dm(homeless)
    cursor = world.cursor()
    assert PrewarmHints().hint_room(world.store, stage.hub, room["id"]) == []
    assert world.events(box, cursor) == []
