"""A person's Stop and Wake (issue 25), in-process: the events on the Computer's stream,
the refusals, the notice a stopped turn leaves, and the web forms (CSRF)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from crew_server.api.stream import EventHub
from crew_server.app import create_app
from crew_server.clock import Clock
from crew_server.store import Store
from tests.server.conftest import START
from tests.server.test_delivery_edges import claimed_turn
from tests.server.world import Computer, World
from tests.web.site import Site

pytestmark = pytest.mark.anyio


@dataclass
class Stage:
    """The world, the app's event hub (whose listening Computers count as connected)
    and a signed-out browser on the same app."""

    world: World
    hub: EventHub
    browser: httpx.AsyncClient

    async def connected(self, name: str = "box") -> Computer:
        """A Computer that connected and holds its event stream open (as the hub sees it)."""
        box = await self.world.computer(name)
        self.hub.subscribe(box.id)
        return box

    async def signed_in(self) -> str:
        """Sign the browser in; the session's CSRF token."""
        site = Site(self.browser, self.world.client, self.world.store, self.world.user_token)
        return await site.sign_in()


@pytest.fixture
async def stage(store_location: str) -> AsyncIterator[Stage]:
    clock = Clock(START)
    store = Store(store_location, clock)
    app = create_app(store, clock, dev=True)
    async with LifespanManager(app) as manager, World.open(manager.app, store, clock) as world:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as browser:
            yield Stage(world, app.state.hub, browser)
    store.close()


async def running(stage: Stage) -> tuple[Computer, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A connected Computer, its agent @ada with a dm, and a running turn over a message."""
    box = await stage.connected()
    ada = await stage.world.agent("ada", box)
    room = await stage.world.dm(ada)
    await stage.world.post(room["id"], "please run the long job")
    turn = await claimed_turn(stage.world, box, ada)
    return box, ada, room, turn


async def finish(stage: Stage, box: Computer, turn: dict[str, Any], status: str) -> None:
    body: dict[str, Any] = {"fence": turn["fence"], "status": status}
    if status != "succeeded":
        body["failure"] = {"class": "stopped", "reason": "the turn was stopped"}
    await stage.world.ok(
        "POST", f"/computer/turns/{turn['turn_id']}/finish", json=body, headers=box.headers
    )


def refusal(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return str(response.json()["error"]["message"])


async def test_stop_sends_the_running_turn_to_its_computer(stage: Stage) -> None:
    world = stage.world
    box, ada, _, turn = await running(stage)
    cursor = world.cursor()
    answer = await world.ok(
        "POST", f"/api/agents/{ada['id']}/stop", json={"turn_id": turn["turn_id"]}, status=202
    )
    assert answer == {"agent_id": ada["id"], "turn_id": turn["turn_id"]}
    assert world.events(box, cursor) == [
        ("stop", {"agent_id": ada["id"], "turn_id": turn["turn_id"]})
    ]


async def test_a_stopped_turn_leaves_one_notice_and_its_message_unread(stage: Stage) -> None:
    world = stage.world
    box, ada, room, turn = await running(stage)
    await world.ok(
        "POST", f"/api/agents/{ada['id']}/stop", json={"turn_id": turn["turn_id"]}, status=202
    )
    cursor = world.cursor()
    await finish(stage, box, turn, "cancelled")
    bodies = [m["body"] for m in await world.messages(room["id"])]
    assert bodies[0] == "please run the long job"
    assert bodies[1:] == ["@ada stopped (you asked); your messages wait unread until you Wake it"]
    assert world.wakes(box, cursor) == []  # nobody runs again by itself
    # Unread: the next claim hands the message out again (with the notice).
    again = await world.unread(box, ada)
    assert again[0]["messages"][0]["body"] == "please run the long job"


async def test_a_cancelled_turn_nobody_stopped_leaves_no_notice(stage: Stage) -> None:
    world = stage.world
    box, _, room, turn = await running(stage)
    await finish(stage, box, turn, "cancelled")  # e.g. the Computer shutting down
    assert [m["body"] for m in await world.messages(room["id"])] == ["please run the long job"]


async def test_stop_refusals_say_why(stage: Stage) -> None:
    world = stage.world
    box, ada, _, turn = await running(stage)
    bea = await world.agent("bea", box)
    stop = f"/api/agents/{ada['id']}/stop"
    missing = "00000000-0000-4000-8000-000000000000"
    answer = await world.client.post(f"/api/agents/{missing}/stop", json={"turn_id": missing})
    assert "no agent" in refusal(answer, 404)
    answer = await world.client.post(
        f"/api/agents/{bea['id']}/stop", json={"turn_id": turn["turn_id"]}
    )
    assert "no turn" in refusal(answer, 404)  # a turn of another agent
    assert refusal(await world.client.post(stop, json={"turn_id": "nope"}), 422)
    await finish(stage, box, turn, "succeeded")
    cursor = world.cursor()
    answer = await world.client.post(stop, json={"turn_id": turn["turn_id"]})
    assert "is succeeded, not running" in refusal(answer, 409)
    assert world.events(box, cursor) == []


async def test_stop_and_wake_of_an_agent_its_computer_cannot_hear_are_refused(
    stage: Stage,
) -> None:
    world = stage.world
    away = await world.computer("away")  # connected once, its stream not open now
    homeless = await world.agent("homeless", None)
    answer = await world.client.post(f"/api/agents/{homeless['id']}/wake")
    assert "on no Computer" in refusal(answer, 409)
    if world.store.dialect == "postgresql":
        return  # its stream may be open on another server process: not known here
    cal = await world.agent("cal", away)
    cursor = world.cursor()
    answer = await world.client.post(f"/api/agents/{cal['id']}/wake")
    assert "its Computer is not connected" in refusal(answer, 409)
    answer = await world.client.post(
        f"/api/agents/{cal['id']}/stop", json={"turn_id": "00000000-0000-4000-8000-000000000000"}
    )
    assert "its Computer is not connected" in refusal(answer, 409)
    assert world.events(away, cursor) == []


async def test_wake_asks_for_a_turn_now(stage: Stage) -> None:
    world = stage.world
    box = await stage.connected()
    ada = await world.agent("ada", box)
    cursor = world.cursor()
    answer = await world.ok("POST", f"/api/agents/{ada['id']}/wake", status=202)
    assert answer == {"agent_id": ada["id"]}
    assert world.events(box, cursor) == [("wake", {"agent_id": ada["id"], "now": True})]
    missing = "00000000-0000-4000-8000-000000000000"
    assert "no agent" in refusal(await world.client.post(f"/api/agents/{missing}/wake"), 404)


async def test_the_agent_page_offers_stop_while_a_turn_runs_and_wake_after(stage: Stage) -> None:
    box, ada, _, turn = await running(stage)
    await stage.signed_in()
    page = (await stage.browser.get(f"/agents/{ada['id']}")).text
    assert f'name="turn_id" value="{turn["turn_id"]}"' in page
    assert "Stop this turn?" in page and "<details" in page
    assert f'action="/agents/{ada["id"]}/wake"' not in page
    await finish(stage, box, turn, "succeeded")
    page = (await stage.browser.get(f"/agents/{ada['id']}")).text
    assert f'action="/agents/{ada["id"]}/wake"' in page
    assert "Stop this turn?" not in page
    homeless = await stage.world.agent("homeless", None)
    page = (await stage.browser.get(f"/agents/{homeless['id']}")).text
    assert "/wake" not in page and "/stop" not in page  # no Computer would hear either


async def test_the_web_forms_need_the_csrf_token(stage: Stage) -> None:
    world = stage.world
    box, ada, _, turn = await running(stage)
    csrf = await stage.signed_in()
    stop, wake = f"/agents/{ada['id']}/stop", f"/agents/{ada['id']}/wake"
    cursor = world.cursor()
    for data in ({}, {"csrf": csrf[:-2] + "xx"}):
        for path in (stop, wake):
            answer = await stage.browser.post(path, data={**data, "turn_id": turn["turn_id"]})
            assert answer.status_code == 403 and "CSRF" in answer.text
    assert world.events(box, cursor) == []
    here = f"/agents/{ada['id']}"
    answer = await stage.browser.post(
        stop, data={"csrf": csrf, "turn_id": turn["turn_id"], "back": here}
    )
    assert answer.status_code == 303 and answer.headers["location"] == here
    answer = await stage.browser.post(wake, data={"csrf": csrf, "back": here})
    assert answer.status_code == 303
    assert world.events(box, cursor) == [
        ("stop", {"agent_id": ada["id"], "turn_id": turn["turn_id"]}),
        ("wake", {"agent_id": ada["id"], "now": True}),
    ]
