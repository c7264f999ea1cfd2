"""The turn pipeline (`engine/pipeline.py`) over a scripted way: retry and session bookkeeping.

A scripted `Way` stands in for the launcher and the warm server (swapped in,
never patched); the agent's directories are real, so the session file is.
The pipeline keeps the session of a turn that succeeded, not of one whose
`crew reply` was refused (the runner fails that turn), and a session it
could not save makes the agent's next turn start anew.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from computer_service.engine.attempt import Attempt
from computer_service.engine.base import EngineEvent, FailureClass, TurnRequest, TurnResult
from computer_service.engine.pipeline import OpenCodeEngine, Way
from computer_service.engine.preparation import PreparedTurn
from computer_service.engine.session import read_session_record
from computer_service.home import AgentHome
from crew_common.launcher_wire import ExitFrame
from crew_common.layout import AgentPaths
from tests.computer_unit.test_home import make_home

pytestmark = pytest.mark.anyio

MODEL = "local/m"
AT = "2026-01-01T00:00:00+00:00"


def ran(session_id: str, code: int = 0, stderr: str = "") -> Attempt:
    """An attempt as a finished `opencode run` leaves it."""
    return Attempt(
        session_id=session_id, lines=1, exit=ExitFrame(t="exit", code=code, stderr_tail=stderr)
    )


VANISHED = Attempt(
    lines=0, exit=ExitFrame(t="exit", code=1, stderr_tail="Error: Session not found")
)


class ScriptedWay(Way):
    """Each attempt is the next of `script`; records the sessions it was asked for."""

    def __init__(self, *script: Attempt, events: list[EngineEvent] | None = None) -> None:
        self.script = list(script)
        self.events = events or []
        self.sessions: list[str | None] = []
        self.open = 0

    @asynccontextmanager
    async def attempts(self, turn: PreparedTurn, on_event: Any, stop: Any) -> AsyncIterator[Any]:
        self.on_event = on_event
        self.open += 1
        try:
            yield self
        finally:
            self.open -= 1

    async def attempt_in(self, session_id: str | None) -> Attempt:
        self.sessions.append(session_id)
        for event in self.events:
            await self.on_event(event)
        return self.script.pop(0)

    async def settle(self, last: Attempt) -> bool:
        return False


class Prepared:
    """The preparation without the user's OpenCode: the agent's real directories, no env."""

    def __init__(self, home: AgentHome) -> None:
        self.home = home

    def paths(self, agent_id: str) -> AgentPaths:
        return self.home.paths

    def secrets(self, paths: AgentPaths) -> list[str]:
        return [str(paths.crew_home)]

    async def prepare(
        self, request: TurnRequest, stop: Any, paths: AgentPaths, secrets: list[str]
    ) -> PreparedTurn:
        return PreparedTurn(request, paths, {}, [], Path("/bin"), [], 1024, secrets)


def rig(tmp_path: Path, way: ScriptedWay) -> tuple[OpenCodeEngine, AgentHome]:
    home = make_home(tmp_path)
    home.prepare("t")
    return OpenCodeEngine(Prepared(home), way), home  # type: ignore[arg-type]


async def turn(engine: OpenCodeEngine, home: AgentHome) -> TurnResult:
    plan = engine.plan_session(home.paths.agent_id, MODEL, home.agents_md)
    request = TurnRequest(home.paths.agent_id, MODEL, plan, lambda new: "hi")

    async def on_event(event: EngineEvent) -> None:
        return None

    return await engine.run_turn(request, on_event, anyio.Event())


async def test_a_succeeded_turn_keeps_its_session_and_the_next_continues_it(
    tmp_path: Path,
) -> None:
    way = ScriptedWay(ran("ses_one"), ran("ses_one"))
    engine, home = rig(tmp_path, way)
    first = await turn(engine, home)
    assert first.status == "succeeded" and first.session_id == "ses_one"
    record = read_session_record(home.paths)
    assert record is not None and (record.session_id, record.model) == ("ses_one", MODEL)
    assert (await turn(engine, home)).status == "succeeded"
    assert way.sessions == [None, "ses_one"] and way.open == 0


async def test_a_vanished_session_is_tried_once_more_in_a_new_one(tmp_path: Path) -> None:
    way = ScriptedWay(ran("ses_one"), VANISHED, ran("ses_two"))
    engine, home = rig(tmp_path, way)
    await turn(engine, home)
    second = await turn(engine, home)
    assert second.status == "succeeded" and second.session_id == "ses_two"
    assert way.sessions == [None, "ses_one", None]
    record = read_session_record(home.paths)
    assert record is not None and record.session_id == "ses_two"


async def test_a_failed_turn_keeps_no_session(tmp_path: Path) -> None:
    way = ScriptedWay(ran("ses_one", code=1, stderr="Error: boom"))
    engine, home = rig(tmp_path, way)
    result = await turn(engine, home)
    assert result.status == "failed" and read_session_record(home.paths) is None


async def test_a_turn_whose_reply_was_refused_keeps_no_session(tmp_path: Path) -> None:
    refused = EngineEvent(
        "tool_use",
        AT,
        {
            "tool": "bash",
            "input": {"command": "crew reply --room room-1 'done'"},
            "output": "error: the server refused the reply",
            "failed": True,
        },
    )
    way = ScriptedWay(ran("ses_one"), events=[refused])
    engine, home = rig(tmp_path, way)
    result = await turn(engine, home)
    # The engine succeeded; the runner fails the turn `reply_refused` (its rule, the same
    # `ReplyAttempts`), and a failed turn's session is not kept.
    assert result.status == "succeeded" and read_session_record(home.paths) is None


async def test_a_session_that_cannot_be_saved_is_lost_and_the_next_turn_starts_anew(
    tmp_path: Path,
) -> None:
    way = ScriptedWay(ran("ses_one"), ran("ses_two"), ran("ses_three"), ran("ses_three"))
    engine, home = rig(tmp_path, way)
    await turn(engine, home)
    # What a hostile agent could do from inside its sandbox: its engine dir a link.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    engines = home.paths.agent_dir / "engines"
    os.rename(engines, tmp_path / "old-engines")
    engines.symlink_to(elsewhere)
    lost = await turn(engine, home)
    assert lost.status == "succeeded" and lost.session_id is None
    assert list(elsewhere.iterdir()) == []
    # Put back: the saved `ses_one` matches again, but the agent's last session was lost,
    # so the next turn starts a new one rather than continue that older one.
    os.unlink(engines)
    os.rename(tmp_path / "old-engines", engines)
    record = read_session_record(home.paths)
    assert record is not None and record.session_id == "ses_one"
    assert (await turn(engine, home)).session_id == "ses_three"
    await turn(engine, home)
    assert way.sessions == [None, None, None, "ses_three"]


async def test_an_engine_bug_is_a_crashed_turn_and_frees_the_way(tmp_path: Path) -> None:
    way = ScriptedWay()  # no attempt scripted: the way raises
    engine, home = rig(tmp_path, way)
    result = await turn(engine, home)
    assert result.status == "failed" and result.failure is not None
    assert result.failure.cls is FailureClass.PROCESS_CRASHED and way.open == 0
    assert str(home.paths.crew_home) not in result.failure.reason
