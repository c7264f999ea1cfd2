"""Waiting on the server's turn records: an agent's finished turns, oldest first.

One order for every caller: `server.turns()` answers newest first, and a test that
says "the second turn" means the second one that ran.
"""

from __future__ import annotations

from typing import Any

from crew_harness.waiting import wait_until, wait_until_async
from crew_testkit.crew_server_proc import CrewServer


def finished_turns(server: CrewServer, agent_id: str, count: int) -> list[dict[str, Any]] | None:
    """The agent's finished turns, oldest first, if there are at least `count`; else None."""
    done = [t for t in reversed(server.turns(agent_id)) if t["status"] != "running"]
    return done if len(done) >= count else None


def finished(
    server: CrewServer, agent_id: str, count: int, timeout: float = 30
) -> list[dict[str, Any]]:
    """Wait for `finished_turns` to answer."""
    return wait_until(
        f"{count} finished turns", lambda: finished_turns(server, agent_id, count), timeout
    )


async def finished_async(
    server: CrewServer, agent_id: str, count: int, timeout: float = 30
) -> list[dict[str, Any]]:
    """`finished` for async tests (other tasks, e.g. an in-process Computer, run meanwhile)."""
    return await wait_until_async(
        f"{count} finished turns", lambda: finished_turns(server, agent_id, count), timeout
    )
