"""Helpers shared by the fault tests: the Computer as a real process, waiting on the server."""

from __future__ import annotations

import re
from typing import Any

import orjson

from crew_testkit.computer_proc import ComputerProc


def read_positions(server: Any, agent_id: str) -> dict[str, tuple[int, int]]:
    """`{room_id: (delivered_seq, read_seq)}` of an agent."""
    return {p["room_id"]: (p["delivered_seq"], p["read_seq"]) for p in server.positions(agent_id)}


def wake_event(agent_id: str) -> bytes:
    """A well-formed SSE `wake` for `agent_id`, as a proxy injects it."""
    return b"event: wake\ndata: " + orjson.dumps({"agent_id": agent_id}) + b"\n\n"


def dropped_batches(c: ComputerProc) -> int:
    """How many event batches the Computer gave up sending (its `/metrics`)."""
    with c.local() as local:
        text = local.get("/metrics").text
    found = re.search(r'^crew_report_batches_total\{outcome="dropped"\} (\d+)$', text, re.M)
    assert found, text
    return int(found.group(1))
