"""Each MCP server's state (issue 27): read from OpenCode's `GET /mcp`, shown, reported."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from computer_service.capabilities_report import CapabilitiesReport
from computer_service.engine.capabilities import mcp_states
from computer_service.upstream import AgentRecord, UpstreamRejected, UpstreamUnavailable
from computer_service.watch import render_status
from crew_common.capabilities import parse

CAPS = parse(
    {
        "mcp_servers": [
            {"type": "local", "name": "a", "command": ["x"]},
            {"type": "local", "name": "b", "command": ["x"]},
            {"type": "remote", "name": "c", "url": "https://example.com/mcp"},
            {"type": "local", "name": "d", "command": ["x"], "enabled": False},
            {"type": "local", "name": "e", "command": ["x"]},
        ]
    }
)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (
            {
                "a": {"status": "connected"},
                "b": {"status": "failed", "error": "ENOENT: posix_spawn 'x'"},
                "c": {"status": "needs_auth"},
                "d": {"status": "disabled"},
            },
            [
                ("a", "connected", None),
                ("b", "failed", "ENOENT: posix_spawn 'x'"),
                ("c", "failed", "oauth"),
                ("d", "disabled", None),
                ("e", "starting", None),
            ],
        ),
        (
            "not an object",
            [(n, "starting", None) for n in "abc"]
            + [("d", "disabled", None)]
            + [("e", "starting", None)],
        ),
        ({"a": {"status": "failed"}}, [("a", "failed", "no reason")]),
    ],
)
def test_opencode_statuses_map_to_ours(status: Any, expected: list[tuple]) -> None:
    got = mcp_states(CAPS, status)
    for (name, state, reason), row in zip(expected, got, strict=False):
        assert (row["name"], row["state"]) == (name, state)
        if reason is None:
            assert row["reason"] is None
        else:
            assert reason.lower() in str(row["reason"]).lower()


class Sink:
    def __init__(self, fail: Exception | None = None) -> None:
        self.sent: list[tuple[str, str, list[dict[str, Any]]]] = []
        self.fail = fail

    async def put_capabilities_state(
        self, agent_id: str, version: str, servers: list[dict[str, Any]]
    ) -> None:
        if self.fail is not None:
            raise self.fail
        self.sent.append((agent_id, version, servers))


def _agent(version: str | None, caps: dict | None = None) -> AgentRecord:
    return AgentRecord.model_validate(
        {
            "id": "a1",
            "handle": "a",
            "name": "A",
            "model": "local/scripted",
            "capabilities": caps,
            "capabilities_version": version,
        }
    )


@pytest.mark.anyio
async def test_the_state_is_reported_once_per_change() -> None:
    report, sink = CapabilitiesReport(), Sink()
    doc = {"mcp_servers": [{"type": "local", "name": "a", "command": ["x"]}]}
    one = [{"name": "a", "state": "connected", "reason": None}]
    await report.after_turn(sink, _agent("v1", doc), {"engine_mode": "cold"})
    assert sink.sent == []  # not known yet: no warm turn said
    await report.after_turn(sink, _agent("v1", doc), {"mcp_servers": one})
    await report.after_turn(sink, _agent("v1", doc), {"mcp_servers": one})
    assert sink.sent == [("a1", "v1", one)]
    await report.after_turn(sink, _agent("v2", doc), {"mcp_servers": one})
    await report.after_turn(sink, _agent("v3"), {})  # no servers: an empty list is known
    assert [s[1:] for s in sink.sent[1:]] == [("v2", one), ("v3", [])]
    await report.after_turn(sink, _agent(None), {"mcp_servers": one})  # an older server
    assert len(sink.sent) == 3


@pytest.mark.anyio
async def test_a_failed_report_is_tried_again_a_refused_one_not() -> None:
    doc = {"mcp_servers": [{"type": "local", "name": "a", "command": ["x"]}]}
    one = [{"name": "a", "state": "connected", "reason": None}]
    report, down = CapabilitiesReport(), Sink(UpstreamUnavailable("down"))
    await report.after_turn(down, _agent("v1", doc), {"mcp_servers": one})
    ok = Sink()
    await report.after_turn(ok, _agent("v1", doc), {"mcp_servers": one})
    assert len(ok.sent) == 1
    report, refused = CapabilitiesReport(), Sink(UpstreamRejected("404"))
    await report.after_turn(refused, _agent("v1", doc), {"mcp_servers": one})
    await report.after_turn(ok, _agent("v1", doc), {"mcp_servers": one})
    assert len(ok.sent) == 1  # not again: it would be refused again


def test_status_lists_an_agents_mcp_servers() -> None:
    health = {
        "version": "1",
        "server_url": "http://s",
        "ready": True,
        "connected": True,
        "connected_since": "2026-01-01T00:00:00Z",
        "sandbox": {"ok": True, "backend": "bwrap", "reason": None},
        "engine": {"found": True, "version": "1.18.33"},
        "running_turns": 0,
        "queued": 0,
    }
    agent = {
        "handle": "alice",
        "state": "idle",
        "turn_id": None,
        "last_result": None,
        "today": {},
        "egress": "public",
        "engine": {
            "engine_mode": "warm",
            "mcp_servers": [
                {"name": "notes", "state": "connected", "reason": None},
                {"name": "broken", "state": "failed", "reason": "ENOENT: posix_spawn 'x'"},
            ],
        },
    }
    text = render_status(health, [agent], datetime(2026, 1, 1, tzinfo=UTC))
    assert "@alice MCP servers: notes connected, broken failed (ENOENT: posix_spawn 'x')" in text
