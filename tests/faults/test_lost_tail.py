"""The events a turn produced while the server was down show as a gap (issue 10); real processes.

The server dies (SIGKILL) while the engine is still producing a turn's events
and comes back before the turn's end is recorded. The events reported while
it was away are dropped (the Computer does not keep them), so the server holds
only the head of the turn. Before issue 10 the finished turn then read
`gaps: []` with a silently short event list, as if that were all the agent
did. Now the finish carries the turn's `event_count`, and the server records
the missing tail as a gap ending at `event_count - 1`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crew_testkit.computer_proc import bootstrap_for, launch, machine
from crew_testkit.crew_server_proc import start_crew_server
from crew_testkit.waiting import wait_until
from tests.faults.chain import dropped_batches, finished, need_sandbox, read_positions, usable

pytestmark = pytest.mark.timeout(150)

# Tool calls the engine makes after the one the server dies during.
TAIL_TOOLS = 25
# Every event of the turn: step_start, the 3 + 1 + TAIL_TOOLS tool calls and
# their step_finish, then a text step (step_start, text, step_finish).
EVENT_COUNT = 1 + 3 + 1 + TAIL_TOOLS + 1 + 3


def test_events_lost_while_the_server_was_down_are_a_gap_at_the_end_of_the_turn(
    tmp_path: Path,
) -> None:
    need_sandbox()
    server = start_crew_server(tmp_path / "srv")
    port = int(server.url.rsplit(":", 1)[1])
    try:
        comp = server.create_computer()
        agent = server.create_agent("losttail1", computer_id=comp["computer_id"])
        dm = server.create_room("dm", [agent["id"]])
        with machine() as m:
            m.log_in()
            c = launch(m, bootstrap_for(server.url, comp["token"], m))
            try:
                usable(c)
                work = m.crew_home / "agents" / agent["id"] / "work"
                # Three quick tool calls, a slow one the server dies during, then many more.
                commands = [
                    "echo 1",
                    "echo 2",
                    "echo 3",
                    "sleep 4; touch reached-the-end",
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
                # The engine produces the rest of the turn while the server is away.
                wait_until("the engine's end", lambda: (work / "reached-the-end").exists())
                wait_until("a dropped report", lambda: dropped_batches(c) >= 1)
                server = start_crew_server(tmp_path / "srv", db=server.db, port=port)

                [turn] = finished(server, agent["id"], 1)
                assert turn["id"] == running["id"]
                assert turn["status"] == "succeeded", turn
                record = server.turn(turn["id"])
                held = len(record["events"])
                assert 4 <= held < EVENT_COUNT, record["events"]
                # The tail the server never got is a gap, up to the turn's last event.
                assert record["gaps"], record
                assert record["gaps"][-1]["to_index"] == EVENT_COUNT - 1, record["gaps"]
                covered = {e["index"] for e in record["events"]} | {
                    i for g in record["gaps"] for i in range(g["from_index"], g["to_index"] + 1)
                }
                assert covered == set(range(EVENT_COUNT)), record["gaps"]
                assert read_positions(server, agent["id"])[dm["id"]] == (message["seq"],) * 2
            finally:
                code = c.stop()
            assert code == 0, c.stderr()[-3000:]
    finally:
        server.stop()
