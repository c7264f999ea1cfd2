"""The Computer's `tool_start` event (issue 25): accepted and stored like any turn event,
with the `call_id` its `tool_use` shares; a type the API does not know is still refused."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.test_turns import event, send
from tests.server.world import World

pytestmark = pytest.mark.anyio


async def a_turn(world: World) -> tuple[Any, dict[str, Any]]:
    box = await world.computer()
    alice = await world.agent("alice", box)
    body = {"rooms": [], "input": "go", "engine": "opencode", "model": "p/m", "session_id": None}
    turn = await world.ok(
        "POST", f"/computer/agents/{alice['id']}/turns", json=body, headers=box.headers, status=201
    )
    return box, turn


async def test_a_tool_start_and_its_tool_use_are_recorded_in_order(world: World) -> None:
    box, turn = await a_turn(world)
    started = event(
        "tool_start", call_id="call_1", tool="bash", input={"command": "ls"}, title=None
    )
    used = event(
        "tool_use",
        call_id="call_1",
        tool="bash",
        title="ls",
        input={"command": "ls"},
        output="a\n",
        duration_ms=12,
        failed=False,
    )
    await send(world, box, turn, 0, [event("step_start"), started, used])
    record = await world.ok("GET", f"/api/turns/{turn['turn_id']}")
    assert [e["type"] for e in record["events"]] == ["step_start", "tool_start", "tool_use"]
    assert record["events"][1]["data"] == started["data"]
    assert record["events"][2]["data"]["call_id"] == "call_1"


async def test_an_event_type_the_api_does_not_know_is_refused(world: World) -> None:
    box, turn = await a_turn(world)
    await send(world, box, turn, 0, [event("tool_begin", call_id="call_1")], status=422)
