"""How to add an engine: implement `Engine` and choose it in the parts (docs/architecture.md).

A toy third engine, a few dozen lines, goes through the service and the
roster unchanged (the test swaps the parts' engine, as `parts.py` chooses
one): its turn is recorded upstream, and what it says of itself shows in
`/agents`, `/health` and `/metrics`; its `maintain` runs for the service's
life and is cancelled at the stop. The service and the roster know the
engine only by its protocol: they import nothing else of `engine/`.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import anyio
import pytest

from computer_service.engine.base import (
    EngineEvent,
    EventSink,
    SessionPlan,
    StopSignal,
    TurnRequest,
    TurnResult,
    Usage,
)
from crew_harness.waiting import wait_until_async
from tests.computer.fakes import FakeParts
from tests.computer.test_service_agents import serving

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


class EchoEngine:
    """Answers every turn with its input's length; one pretend server per agent it ran."""

    name = "echo"

    def __init__(self) -> None:
        self.turns = 0
        self.agents: set[str] = set()
        self.maintaining = False
        self.maintained = False

    def plan_session(self, agent_id: str, model: str, agents_md: str) -> SessionPlan:
        return SessionPlan(None)

    async def run_turn(
        self, request: TurnRequest, on_event: EventSink, stop: StopSignal
    ) -> TurnResult:
        text = request.render_input(True)
        await on_event(EngineEvent("text", "2026-01-01T00:00:00+00:00", {"text": f"{len(text)}"}))
        self.turns += 1
        self.agents.add(request.agent_id)
        return TurnResult("succeeded", session_id="ses_echo", usage=Usage(len(text), 1))

    async def maintain(self) -> None:
        self.maintaining = True
        try:
            await anyio.sleep_forever()
        finally:
            self.maintained = True

    def health(self) -> dict[str, object] | None:
        return {
            "servers": len(self.agents),
            "rss_bytes": 0,
            "memory_budget_bytes": 1,
            "server_ceiling_bytes": 1,
            "idle_timeout_s": 1.0,
        }

    def agent_status(self, agent_id: str) -> dict[str, object]:
        return {"engine_mode": "warm", "warm": agent_id in self.agents}

    def metric_lines(self) -> list[str]:
        return ["# TYPE crew_echo_turns_total counter", f"crew_echo_turns_total {self.turns}"]


async def test_a_third_engine_runs_a_turn_and_reports_through_the_service(
    crew_server: Any, tmp_path: Path
) -> None:
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("echo1", computer_id=comp["computer_id"])
    room = crew_server.create_room("dm", [agent["id"]])
    crew_home = tmp_path / "crew"
    engine = EchoEngine()
    async with serving(crew_server, crew_home, FakeParts(crew_home, engine), comp["token"]) as (
        service,
        local,
    ):
        await wait_until_async("maintain runs", lambda: engine.maintaining)
        row = (await local.get("/agents")).json()[0]
        assert row["engine"]["engine_mode"] == "warm" and row["engine"]["warm"] is False
        crew_server.post(room["id"], "hello echo")
        await wait_until_async("one turn", lambda: service.metrics.turns["succeeded"] == 1)

        [turn] = crew_server.turns(agent["id"])
        assert turn["status"] == "succeeded" and turn["engine"] == "echo"
        row = (await local.get("/agents")).json()[0]
        assert row["engine"]["warm"] is True and row["session_id"] == "ses_echo"
        assert (await local.get("/health")).json()["warm"]["servers"] == 1
        assert "crew_echo_turns_total 1" in (await local.get("/metrics")).text.splitlines()
    assert engine.maintained  # cancelled with the service's task group


@pytest.mark.parametrize("module", ["service.py", "roster.py", "runner.py"])
def test_the_service_knows_an_engine_only_by_its_protocol(module: str) -> None:
    import computer_service

    source = Path(computer_service.__file__).with_name(module).read_text()
    engine_modules = {
        node.module
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)
        and node.module is not None
        and node.module.startswith("computer_service.engine")
    }
    # `failures`: the pure rules the runner applies to a turn's events (reply refusals).
    assert engine_modules <= {"computer_service.engine.base", "computer_service.engine.failures"}
    assert "isinstance(self.engine" not in source and "isinstance(engine" not in source
