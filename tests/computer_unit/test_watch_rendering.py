"""What `crew-computer status` and `follow` print: table tests of the pure renderers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from computer_service.watch import EventPrinter, render_status

NOW = datetime(2026, 3, 1, 10, 17, 41, tzinfo=UTC)
ZERO = {
    "turns": 0,
    "input_tokens": 0,
    "output_tokens": 0,
    "reasoning_tokens": 0,
    "cache_read": 0,
    "cache_write": 0,
    "cost": 0.0,
}


def health(**changes: Any) -> dict[str, Any]:
    return {
        "version": "0.1.0",
        "server_url": "http://127.0.0.1:8765",
        "ready": True,
        "connected": True,
        "connected_since": "2026-03-01T08:12:40+00:00",
        "sandbox": {"ok": True, "backend": "bwrap", "reason": None},
        "engine": {"found": True, "version": "1.18.33"},
        "agents": 2,
        "running_turns": 1,
        "queued": 0,
    } | changes


def agent(handle: str, **changes: Any) -> dict[str, Any]:
    return {
        "id": f"id-{handle}",
        "handle": handle,
        "state": "idle",
        "turn_id": None,
        "pending_wake": False,
        "last_result": None,
        "last_reason": None,
        "session_id": None,
        "model": "p/m",
        "problem": None,
        "retry_at": None,
        "turn_started_at": None,
        "today": ZERO,
        "egress": "public",
    } | changes


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    # Times print in local time: make it UTC for the table.
    import time

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


def test_status_is_a_header_and_a_row_per_agent() -> None:
    agents = [
        agent(
            "alice",
            state="running",
            turn_id="t-1",
            last_result="succeeded",
            turn_started_at="2026-03-01T10:17:00+00:00",
            today=ZERO | {"input_tokens": 17900, "output_tokens": 340, "cost": 0.0412},
        ),
        agent(
            "bob",
            state="problem",
            problem="sandbox unavailable: bwrap not found",
            egress="allow github.com:443, *.pypi.org",
        ),
        agent(
            "carol",
            last_result="failed",
            last_reason="the provider refused: 429",
            retry_at="2026-03-01T10:18:00+00:00",
            pending_wake=True,
        ),
    ]
    assert render_status(health(), agents, NOW) == (
        "Server:   http://127.0.0.1:8765, connected since 2026-03-01 08:12:40 (2h05m)\n"
        "Computer: version 0.1.0, sandbox bwrap (ok), engine opencode 1.18.33\n"
        "Turns:    1 running, 0 queued\n"
        "\n"
        "AGENT   STATE      TURN  AGE  LAST RESULT  TOKENS TODAY                 COST TODAY  "
        "EGRESS\n"
        "@alice  running    t-1   41s  succeeded    18,240 (17,900 in, 340 out)  $0.0412     "
        "public\n"
        "@bob    problem    -     -    -            0 (0 in, 0 out)              $0.0000     "
        "allow github.com:443, *.pypi.org\n"
        "@carol  idle+wake  -     -    failed       0 (0 in, 0 out)              $0.0000     "
        "public\n"
        "\n"
        "@bob: sandbox unavailable: bwrap not found\n"
        "@carol last failed: the provider refused: 429 (retrying at 2026-03-01T10:18:00+00:00)\n"
    )


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        ({"connected": False, "connected_since": None}, "NOT connected (reconnecting)"),
        ({"ready": False, "connected": False, "connected_since": None}, "starting"),
        (
            {"sandbox": {"ok": False, "backend": "bwrap", "reason": "bwrap not found"}},
            "Sandbox:  bwrap not found",
        ),
        ({"sandbox": {"ok": None, "backend": None, "reason": None}}, "sandbox starting"),
        ({"engine": {"found": False, "version": None}}, "engine opencode NOT found"),
    ],
)
def test_status_says_what_is_wrong(changes: dict[str, Any], line: str) -> None:
    text = render_status(health(**changes), [], NOW)
    assert line in text
    assert text.endswith("No agents on this Computer.\n")


def test_follow_prints_one_turn_readably_and_only_the_agent_asked_for() -> None:
    printer = EventPrinter(only="id-alice")
    at = "2026-03-01T10:17:05+00:00"
    engine = {"agent_id": "id-alice", "turn_id": "t-1", "at": at}
    events: list[tuple[str, dict[str, Any]]] = [
        ("state", agent("alice", state="queued")),
        ("state", agent("alice", state="running")),
        ("state", agent("alice", state="running", turn_id="t-1")),
        ("state", agent("alice", state="running", turn_id="t-1", pending_wake=True)),
        ("state", agent("bob", state="running", turn_id="t-9")),
        ("engine", {"agent_id": "id-bob", "turn_id": "t-9", "at": at, "type": "step_start"}),
        ("engine", engine | {"type": "step_start", "data": {}}),
        ("engine", engine | {"type": "reasoning", "data": {"text": "look at\nthe files"}}),
        (
            "engine",
            engine
            | {
                "type": "tool_use",
                "data": {
                    "tool": "bash",
                    "input": {"command": "ls -la", "description": "list"},
                    "output": "a\nb\n" + "x" * 300,
                    "duration_ms": 12,
                    "failed": False,
                },
            },
        ),
        (
            "engine",
            engine
            | {
                "type": "tool_use",
                "data": {"tool": "read", "input": {}, "output": "denied", "failed": True},
            },
        ),
        (
            "engine",
            engine
            | {
                "type": "step_finish",
                "data": {"tokens": {"input": 100, "output": 20}, "cost": 0.001},
            },
        ),
        ("engine", engine | {"type": "text", "data": {"text": "done"}}),
        (
            "engine",
            engine
            | {
                "type": "egress_denied",
                "data": {
                    "address": "10.99.0.1",
                    "port": 80,
                    "protocol": "tcp",
                    "name": None,
                    "count": 3,
                },
            },
        ),
        (
            "engine",
            engine
            | {
                "type": "egress_denied",
                "data": {
                    "address": "2001:db8::5",
                    "port": 53,
                    "protocol": "udp",
                    "name": "evil.example",
                    "count": 1,
                },
            },
        ),
        ("missed", {"count": 3, "reason": "this reader fell more than 1024 events behind"}),
        (
            "turn",
            {
                "agent_id": "id-alice",
                "turn_id": "t-1",
                "status": "failed",
                "failure": {"class": "engine_error", "reason": "boom"},
                "usage": {"input_tokens": 150, "output_tokens": 30, "cost": 0.002},
            },
        ),
        ("turn", {"agent_id": "id-bob", "turn_id": "t-9", "status": "succeeded"}),
    ]
    lines = [line for kind, data in events for line in printer.lines(kind, data)]
    # Drop the clock (local time of printing for state and turn lines).
    assert [line.split(" ", 1)[1] if line[:2].isdigit() else line for line in lines] == [
        "@alice  queued",
        "@alice  ▶ turn t-1 started",
        "@alice  step 1",
        "@alice  thinks: look at ⏎ the files",
        "@alice  tool bash: ls -la",
        "@alice    → a ⏎ b ⏎ " + "x" * 91 + "… (12 ms)",
        "@alice  tool read: -",
        "@alice    → FAILED denied",
        "@alice  says: done",
        "@alice  refused 10.99.0.1:80 (tcp) ×3",
        "@alice  refused evil.example [2001:db8::5]:53 (udp)",
        "(missed 3 events: this reader fell more than 1024 events behind)",
        "@alice  ■ turn failed (engine_error: boom): 1 steps, 2 tool calls, "
        "150 in / 30 out tokens, $0.0020",
    ]
    assert lines[2].startswith("10:17:05 ")  # an engine event prints its own time


def test_status_says_an_agent_held_by_its_budget_waits_and_until_when() -> None:
    held = "budget until 2026-03-02T00:00:00.000000+00:00: budget reached (daily budget $5.10 of $5.00)"
    text = render_status(health(), [agent("ada", held=held)], NOW)
    assert (
        "@ada waits, held by its budget until 2026-03-02T00:00:00.000000+00:00: budget reached "
        "(daily budget $5.10 of $5.00)\n" in text
    )
