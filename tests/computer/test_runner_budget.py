"""A runner whose agent the server holds at its budget cap (issue 24), against a REAL
crew-server: the claim's `paused` is no turn now, shown in its row, with no retry of its
own; after the cap is raised the next wake runs the turn and the hold is gone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crew_harness.waiting import wait_until_async
from crew_testkit.rig import rig
from crew_testkit.scripted import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def crew_home(tmp_path: Path) -> Path:
    return tmp_path / "crew"


async def test_a_held_claim_is_no_turn_shown_in_the_row_without_retrying(
    crew_server: Any, crew_home: Path
) -> None:
    engine = ScriptedEngine()  # every turn costs $0.01 (`succeed`)
    async with rig(crew_server, crew_home, engine) as r:
        agent_id = r.runner.agent.id
        patched = await r.user.http.patch(
            f"/api/agents/{agent_id}", json={"budget": {"daily_usd": 0.01}}
        )
        assert patched.status_code == 200, patched.text
        await r.user.post(r.room["id"], "first")
        r.runner.wake()
        await r.user.finished(agent_id, 1)  # $0.01: the cap is reached

        await r.user.post(r.room["id"], "second")
        r.runner.wake()
        await wait_until_async("the runner shows the hold", lambda: r.runner.held is not None)
        held = r.runner.row()["held"]
        assert held.startswith("budget until ") and "daily budget $0.01 of $0.01" in held
        await wait_until_async(
            "runner idle", lambda: r.runner.state == "idle" and not r.runner.pending_wake
        )
        assert r.runner.retry_at is None  # no retry of its own: the server wakes it
        assert len(engine.inputs) == 1
        assert len(await r.user.turns(agent_id)) == 1

        raised = await r.user.http.patch(
            f"/api/agents/{agent_id}", json={"budget": {"daily_usd": 1}}
        )
        assert raised.status_code == 200, raised.text
        r.runner.wake()  # the service's stream would bring the server's wake
        turns = await r.user.finished(agent_id, 2)
        assert "second" in turns[1]["input"]
        assert r.runner.held is None and r.runner.row()["held"] is None
