"""A turn's events survive a crew server that is away for longer than a restart (issue 20).

Real processes: the server dies (SIGKILL) while the engine is producing a
turn's events and stays away for `OUTAGE_S` — longer than the 6 s the
Computer used to wait (the fault review kept it away 35 s: the turn ended
`interrupted` with 134 of 156 events lost and no gap). Then it comes back on
the same database and port. Now the Computer keeps the events that could not
go out (bounded: `reporter.MAX_KEPT_EVENTS`, `MAX_KEPT_BYTES`), sends them in
order once the server answers, and the ack and the finish wait for it too:
every event arrives, no gap, the turn `succeeded` and its message read.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import bootstrap_for, launch, machine
from crew_testkit.crew_server_proc import start_crew_server
from tests.faults.chain import read_positions
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(180)

OUTAGE_S = 12.0  # the server is away this long at least: twice the old 6 s window
TAIL_TOOLS = 25
# step_start, 3 + 1 + TAIL_TOOLS tool calls, their step_finish, a text step.
EVENT_COUNT = 1 + 3 + 1 + TAIL_TOOLS + 1 + 3


def test_events_of_a_turn_wait_for_a_server_away_longer_than_a_restart(tmp_path: Path) -> None:
    need_sandbox()
    server = start_crew_server(tmp_path / "srv")
    port = int(server.url.rsplit(":", 1)[1])
    try:
        comp = server.create_computer()
        agent = server.create_agent("outage1", computer_id=comp["computer_id"])
        dm = server.create_room("dm", [agent["id"]])
        with machine() as m:
            m.log_in()
            c = launch(m, bootstrap_for(server.url, comp["token"], m))
            try:
                usable(c)
                work = m.crew_home / "agents" / agent["id"] / "work"
                commands = [
                    "echo 1",
                    "echo 2",
                    "echo 3",
                    "sleep 3; touch reached-the-end",
                    *(f"echo tail {n}" for n in range(TAIL_TOOLS)),
                ]
                message = server.post(dm["id"], "many events:\nFAKE:RUNS " + " ;; ".join(commands))
                [running] = wait_until("the turn", lambda: server.turns(agent["id"]))
                wait_until(
                    "the head of the turn",
                    lambda: len(server.turn(running["id"])["events"]) >= 4,
                )
                server.process.kill()
                server.process.wait(timeout=10)
                server.stop()
                away_since = time.monotonic()
                # The engine ends the turn while the server is away; it stays away longer.
                wait_until("the engine's end", lambda: (work / "reached-the-end").exists())
                wait_until(
                    f"{OUTAGE_S:g} s of outage",
                    lambda: time.monotonic() - away_since >= OUTAGE_S,
                    timeout=OUTAGE_S + 30,
                )
                server = start_crew_server(tmp_path / "srv", db=server.db, port=port)

                [turn] = finished(server, agent["id"], 1, timeout=90)
                assert turn["id"] == running["id"]
                record = server.turn(turn["id"])
                assert record["status"] == "succeeded", (record["status"], record["failure"])
                assert [e["index"] for e in record["events"]] == list(range(EVENT_COUNT))
                assert record["gaps"] == [], record["gaps"]
                assert read_positions(server, agent["id"])[dm["id"]] == (message["seq"],) * 2
            finally:
                code = c.stop()
            assert code == 0, c.stderr()[-3000:]
    finally:
        server.stop()
