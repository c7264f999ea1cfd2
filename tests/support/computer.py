"""Helpers for tests that run the Computer as a real process: the sandbox it needs,
its launcher's health, an agent's problem as the server shows it."""

from __future__ import annotations

import shutil
from typing import Any

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import ComputerProc
from tests.support.ci import required_in_ci


def need_sandbox() -> None:
    """bwrap is required in CI; locally its absence skips."""
    if shutil.which("bwrap") is None:
        required_in_ci("bubblewrap (apt-get install bubblewrap)")


def usable(c: ComputerProc) -> dict[str, Any]:
    """`/health` once the launcher answered; the sandbox must be usable."""
    health = wait_until("the launcher's health", c.health_known, 60)
    assert health["sandbox"]["ok"], f"sandbox not usable: {health}\n{c.stderr()[-2000:]}"
    return health


def problem_of(server: Any, agent_id: str) -> str | None:
    """The agent's `problem` as the server lists it."""
    return next(a for a in server.agents() if a["id"] == agent_id).get("problem")
