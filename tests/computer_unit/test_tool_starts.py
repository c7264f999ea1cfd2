"""A tool call reported when it starts (issue 25, "live tool calls"): the warm server's
running tool parts → one `tool_start` line per call → the `tool_start` event, whose
`call_id` the finishing `tool_use` carries too.

The events are a real warm `opencode serve` 1.18.33 turn whose bash call was
`sleep 3; echo done` (tests/samples/README.md); the cold run of the same turn prints
no line while the tool runs, so a cold turn has no `tool_start`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from computer_service.engine.attempt import Attempt
from computer_service.engine.base import EngineEvent
from computer_service.engine.events import OutputCheck, engine_event_of
from computer_service.engine.failures import ReplyAttempts
from computer_service.engine.warm_events import ToolStarts, run_line

SAMPLES = Path(__file__).resolve().parents[2] / "tests" / "samples" / "opencode"
WARM = SAMPLES / "warm_slow_tool.sse.jsonl"
COLD = SAMPLES / "23_slow_tool_cold.stdout.jsonl"


def sse_events() -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in WARM.read_bytes().splitlines() if line.strip()]


def session_id() -> str:
    return next(
        e["properties"]["part"]["sessionID"]
        for e in sse_events()
        if e["type"] == "message.part.updated"
    )


def warm_lines() -> list[dict[str, Any]]:
    """The lines the warm way makes of the sample, as `warm_run` makes them."""
    starts = ToolStarts()
    session = session_id()
    lines = []
    for number, event in enumerate(sse_events()):
        line = run_line(event, session, 1000 + number) or starts.line(event, session, number)
        if line is not None:
            lines.append(line)
    return lines


def warm_events() -> list[EngineEvent]:
    return [engine_event_of(orjson.dumps(line)) for line in warm_lines()]


def test_the_sample_is_a_tool_that_ran_with_several_running_updates() -> None:
    states = [
        e["properties"]["part"]["state"]["status"]
        for e in sse_events()
        if e["type"] == "message.part.updated" and e["properties"]["part"]["type"] == "tool"
    ]
    assert states == ["pending", "running", "running", "running", "completed"]


def test_a_warm_tool_call_starts_once_then_finishes_with_the_same_call_id() -> None:
    events = warm_events()
    assert [e.type for e in events] == [
        "step_start",
        "tool_start",
        "tool_use",
        "step_finish",
        "step_start",
        "text",
        "step_finish",
    ]
    start, use = events[1], events[2]
    assert start.data == {
        "call_id": "call_964921_0",
        "tool": "bash",
        "title": None,  # OpenCode names the call only when it finishes
        "input": {"command": "sleep 3; echo done", "description": "Run scripted command"},
    }
    assert use.data["call_id"] == "call_964921_0"
    assert use.data["output"] == "done\n" and use.data["failed"] is False
    # It is stamped with the tool's own start (`state.time.start`), not when it was seen.
    assert start.at == "2026-12-02T17:02:47.669+00:00"
    assert start.session_id == session_id()


def test_the_cold_run_of_the_same_turn_prints_the_same_lines_but_the_start() -> None:
    cold = [orjson.loads(x)["type"] for x in COLD.read_bytes().splitlines() if x.strip()]
    warm = [line["type"] for line in warm_lines()]
    assert "tool_start" not in cold
    assert [kind for kind in warm if kind != "tool_start"] == cold


def tool_part(status: str, call_id: Any = "call_1", session: str = "ses_a") -> dict[str, Any]:
    state = {"status": status, "input": {"command": "ls"}, "time": {"start": 5}}
    part = {"type": "tool", "tool": "bash", "callID": call_id, "sessionID": session}
    return {"type": "message.part.updated", "properties": {"part": {**part, "state": state}}}


def test_only_the_first_running_update_of_a_call_of_the_session_starts_it() -> None:
    starts = ToolStarts()
    assert starts.line(tool_part("pending"), "ses_a", 1) is None  # no input yet
    first = starts.line(tool_part("running"), "ses_a", 1)
    assert first is not None and first["type"] == "tool_start" and first["timestamp"] == 5
    assert starts.line(tool_part("running"), "ses_a", 2) is None  # a metadata update
    assert starts.line(tool_part("completed"), "ses_a", 3) is None  # run_line's business
    assert starts.line(tool_part("running", "call_2"), "ses_a", 4) is not None
    assert starts.line(tool_part("running", "call_3", "ses_b"), "ses_a", 4) is None
    assert starts.line(tool_part("running", None), "ses_a", 4) is None  # no call id
    assert starts.line({"type": "message.part.updated", "properties": "x"}, "ses_a", 4) is None
    assert starts.line("not an event", "ses_a", 4) is None


@pytest.mark.parametrize(
    "part",
    [{}, {"tool": 3, "callID": 7, "state": "x"}, {"state": {"input": "text", "title": 1}}],
)
def test_an_odd_tool_start_line_still_gives_a_tool_start_event(part: dict[str, Any]) -> None:
    event = engine_event_of(orjson.dumps({"type": "tool_start", "part": part}))
    assert event.type == "tool_start"
    assert set(event.data) == {"call_id", "tool", "title", "input"}
    assert event.data["tool"] == "unknown" and event.data["title"] is None
    assert isinstance(event.data["input"], dict)


def test_a_tool_use_without_a_call_id_has_none_in_its_data() -> None:
    event = engine_event_of(b'{"type":"tool_use","part":{"tool":"bash","state":{}}}')
    assert "call_id" not in event.data


def test_a_start_counts_for_nothing_but_itself() -> None:
    """Steps, usage, the step guard, the output check and `crew reply` refusals see only
    the events they saw before; a start is not an answer to any room."""
    attempt, check, replies = Attempt(), OutputCheck(), ReplyAttempts()
    for event in warm_events():
        assert attempt.track(event, max_steps=2) is None
        assert check.see(event) is None
        replies.see(event)
    assert attempt.steps == 2 and attempt.last_error is None
    assert attempt.usage.cost == pytest.approx(
        sum(e.data["cost"] for e in warm_events() if e.type == "step_finish")
    )
    assert replies.refusals == {} and replies.answered == set()
