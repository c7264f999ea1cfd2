"""A turn's trace from the runner (issue 26) against a REAL crew-server: each step the
turn reached, in path order, sent with the finish and shown by introspection."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from computer_service.engine.base import EventSink, StopSignal, TurnRequest, TurnResult
from computer_service.turn_trace import TurnTrace, epoch_ms_of
from crew_testkit.rig import rig
from crew_testkit.scripted import ScriptedEngine, succeed

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PATH_ORDER = ["post", "wake", "claimed", "registered", "engine_accepted", "first_token", "acked"]


async def accepting(
    engine: ScriptedEngine, request: TurnRequest, on_event: EventSink, stop: StopSignal
) -> TurnResult:
    """An engine that says when it took the prompt, as the real ways do."""
    request.mark("engine_accepted")
    return await succeed(engine, request, on_event, stop)


async def test_a_turn_records_its_steps_in_path_order(crew_server: Any, tmp_path: Path) -> None:
    engine = ScriptedEngine(script=[accepting])
    async with rig(crew_server, tmp_path / "crew", engine) as r:
        message = await r.user.post(r.room["id"], "how long did this take?")
        r.runner.wake()
        [turn] = await r.user.finished(r.runner.agent.id, 1)
        trace = turn["trace"]
        assert list(trace) == PATH_ORDER
        stamps = [trace[step] for step in PATH_ORDER]
        assert stamps == sorted(stamps)
        # `post` is the server's time of the newest claimed message.
        assert trace["post"] == int(
            datetime.fromisoformat(message["created_at"]).timestamp() * 1000
        )
        # Introspection shows the same trace with the turn.
        assert r.runner.recent_turns()[0]["trace"] == trace


async def test_an_engine_that_marks_nothing_leaves_its_steps_out(
    crew_server: Any, tmp_path: Path
) -> None:
    engine = ScriptedEngine()
    async with rig(crew_server, tmp_path / "crew", engine) as r:
        await r.user.post(r.room["id"], "hi")
        r.runner.wake()
        [turn] = await r.user.finished(r.runner.agent.id, 1)
        assert "engine_accepted" not in turn["trace"]
        assert "first_token" in turn["trace"]  # the text event of the scripted engine


def test_the_first_mark_of_a_step_counts_and_unknown_steps_are_ignored() -> None:
    trace = TurnTrace()
    trace.mark("claimed", 5)
    trace.mark("claimed", 9)
    trace.mark("lunch", 7)
    trace.saw_event("step_start")  # not the model's output yet
    trace.mark("post", 1)
    assert trace.as_upstream() == {"post": 1, "claimed": 5}
    trace.saw_event("tool_use")
    assert "first_token" in trace.as_upstream()
    assert epoch_ms_of("2026-10-05T09:00:00.250000+00:00") == 1791190800250
    assert epoch_ms_of("2026-10-05T09:00:00") is None  # no offset: not a server time
    assert epoch_ms_of(None) is None and epoch_ms_of("soon") is None


def test_the_computer_and_the_server_name_the_same_trace_steps() -> None:
    """The two processes share no code: the Computer's steps (`turn_trace.STEPS`) and what
    the server's finish accepts (`models.ComputerTraceStep`) are two lists kept equal here."""
    from typing import get_args

    from computer_service import turn_trace
    from crew_server import models

    assert tuple(get_args(models.ComputerTraceStep)) == tuple(turn_trace.STEPS)
