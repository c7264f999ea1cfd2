"""A prewarm hint through the whole chain but the engine (issue 26): a person signs in
to the real crew-server's web app and opens a dm, the server sends `prewarm` on the
Computer's stream, the roster hands the agent to the engine's optional `prewarm` with
its settings; no turn runs. An engine without `prewarm` (the toy third engine) takes
the same hint harmlessly. At start, the roster offers its agents to the engine's
prewarm (the engine picks the most recently active)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from httpx_sse import ServerSentEvent

from computer_service.engine.base import WarmUp
from computer_service.event_stream import EventStream
from crew_harness.waiting import wait_until_async
from tests.computer.fakes import FakeParts
from tests.computer.test_service_agents import serving
from tests.computer.test_third_engine import EchoEngine

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


class WarmingEcho(EchoEngine):
    """The toy engine with a `prewarm` that records what it was asked to warm."""

    def __init__(self) -> None:
        super().__init__()
        self.warmed: list[tuple[list[WarmUp], int | None]] = []

    async def prewarm(self, agents: Sequence[WarmUp], *, most_recent: int | None = None) -> None:
        self.warmed.append((list(agents), most_recent))


def open_room_page(server: Any, room_id: str) -> None:
    """Sign in to the web app with the user token and open the room's page."""
    with httpx.Client(base_url=server.url, timeout=10.0) as browser:
        form = browser.get("/login").text
        found = re.search(r'name="sign_in" value="([^"]*)"', form)
        assert found, form
        data = {"sign_in": found.group(1), "token": server.user_token, "next": "/rooms"}
        assert browser.post("/login", data=data).status_code == 303
        assert browser.get(f"/rooms/{room_id}").status_code == 200


def metric(text: str, name: str) -> float:
    [value] = [line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(value)


async def test_opening_a_dm_hands_its_agent_to_the_engines_prewarm(
    crew_server: Any, tmp_path: Path
) -> None:
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("warmme", computer_id=comp["computer_id"])
    room = crew_server.create_room("dm", [agent["id"]])
    crew_home = tmp_path / "crew"
    engine = WarmingEcho()
    async with serving(crew_server, crew_home, FakeParts(crew_home, engine), comp["token"]) as (
        service,
        local,
    ):
        # At start: every agent offered, the engine to pick the 3 most recently active.
        [(offered, most_recent)] = engine.warmed
        assert [a.agent_id for a in offered] == [agent["id"]] and most_recent == 3
        open_room_page(crew_server, room["id"])
        await wait_until_async("the hint", lambda: len(engine.warmed) == 2)
        [warm_up], most_recent = engine.warmed[1]
        assert most_recent is None
        assert warm_up.agent_id == agent["id"] and warm_up.model == agent["model"]
        assert warm_up.egress == service.roster.runners[agent["id"]].agent.egress
        metrics = (await local.get("/metrics")).text
        assert metric(metrics, "crew_prewarm_hints_received_total") == 1
        assert engine.turns == 0  # a hint is not a turn
        assert crew_server.turns(agent["id"]) == []


async def test_an_engine_without_prewarm_takes_the_hint_and_still_runs_turns(
    crew_server: Any, tmp_path: Path
) -> None:
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("plainecho", computer_id=comp["computer_id"])
    room = crew_server.create_room("dm", [agent["id"]])
    crew_home = tmp_path / "crew"
    engine = EchoEngine()
    async with serving(crew_server, crew_home, FakeParts(crew_home, engine), comp["token"]) as (
        service,
        local,
    ):
        open_room_page(crew_server, room["id"])

        async def hinted() -> bool:
            text = (await local.get("/metrics")).text
            return metric(text, "crew_prewarm_hints_received_total") == 1

        await wait_until_async("the hint", hinted)
        assert engine.turns == 0
        crew_server.post(room["id"], "hello echo")
        await wait_until_async("one turn", lambda: service.metrics.turns["succeeded"] == 1)


class HintedRoster:
    """What the stream hands the roster of a `prewarm`, recorded."""

    def __init__(self) -> None:
        self.hints: list[list[str]] = []

    def prewarm_from_server(self, agent_ids: list[str]) -> None:
        self.hints.append(agent_ids)


@pytest.mark.parametrize(
    ("data", "handed"),
    [
        ({"agent_ids": ["a1", "a2"]}, [["a1", "a2"]]),
        ({"agent_ids": []}, [[]]),
        ({"agent_ids": "a1"}, []),
        ({"agent_ids": ["a1", 2]}, []),
        ({"agent_id": "a1"}, []),
        (["a1"], []),
    ],
)
async def test_the_stream_hands_a_well_formed_prewarm_to_the_roster(
    data: Any, handed: list[list[str]]
) -> None:
    roster = HintedRoster()
    stream = EventStream(None, roster, fail=lambda reason: None)  # type: ignore[arg-type]
    await stream._on_event(ServerSentEvent(event="prewarm", data=orjson.dumps(data).decode()))
    assert roster.hints == handed
