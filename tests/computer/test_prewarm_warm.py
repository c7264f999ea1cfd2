"""Prewarm on the real Computer, launcher, bwrap and pasta (issue 26), the fake engine's
`serve` as the warm server: a person opens a dm whose agent has no server, the hint
starts it, and the turn that follows finds it warm (the prewarm prepared the same
environment a turn does, so no second start). Then the Computer restarts: the agent
that was active is warmed at start, before any message."""

from __future__ import annotations

from typing import Any

import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import ComputerProc, bootstrap_for, launch, machine
from tests.computer.test_prewarm_hints import open_room_page
from tests.computer.test_warm_crowd import _metric, _servers_of
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(240)


def metrics(c: ComputerProc) -> str:
    with c.local() as local:
        return str(local.get("/metrics").text)


def found(text: str, how: str) -> float:
    name = f'crew_warm_turn_server_total{{found="{how}"}} '
    [value] = [line[len(name) :] for line in text.splitlines() if line.startswith(name)]
    return float(value)


def test_a_hint_starts_the_server_the_next_turn_finds_and_a_restart_warms_the_active(
    crew_server: Any,
) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agent = crew_server.create_agent("prewarmed", computer_id=comp["computer_id"])
        idle = crew_server.create_agent("neverran", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [agent["id"]])
        bootstrap = bootstrap_for(crew_server.url, comp["token"], m, engine_mode="warm")
        c = launch(m, bootstrap)
        try:
            usable(c)
            wait_until("the runners", lambda: len(c.get("/agents")) == 2, 60)
            # No agent ran a turn here yet: nothing is warmed at start.
            assert _metric(metrics(c), "crew_prewarm_starts_total") == 0
            assert _servers_of(m.crew_home) == []
            open_room_page(crew_server, dm["id"])
            wait_until(
                "the prewarm's server",
                lambda: _metric(metrics(c), "crew_prewarm_starts_total") == 1,
                60,
            )
            [server] = _servers_of(m.crew_home)
            assert crew_server.turns(agent["id"]) == []  # a hint is not a turn
            crew_server.post(dm["id"], "hello after the hint")
            [turn] = finished(crew_server, agent["id"], 1, timeout=60)
            assert turn["status"] == "succeeded", (turn.get("failure"), c.stderr()[-2000:])
            text = metrics(c)
            assert _metric(text, "crew_warm_starts_total") == 1  # the prewarm's, used
            assert found(text, "warm") == 1 and found(text, "none") == 0
            assert _metric(text, "crew_prewarm_hints_received_total") == 1
            assert _servers_of(m.crew_home) == [server]
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]
        wait_until("no server left", lambda: not _servers_of(m.crew_home), 20)

        # The restart: the agent that ran a turn is warmed at start, the other is not.
        c = launch(m, bootstrap)
        try:
            usable(c)
            wait_until(
                "the start's prewarm",
                lambda: _metric(metrics(c), "crew_prewarm_starts_total") == 1,
                60,
            )
            rows = {row["id"]: row for row in c.get("/agents")}
            assert rows[agent["id"]]["engine"]["warm"] is True
            assert rows[idle["id"]]["engine"]["warm"] is False
            crew_server.post(dm["id"], "good morning")
            *_, second = finished(crew_server, agent["id"], 2, timeout=60)
            assert second["status"] == "succeeded", second
            text = metrics(c)
            assert found(text, "warm") == 1 and _metric(text, "crew_warm_starts_total") == 1
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]
