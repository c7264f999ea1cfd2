"""The crew server dies and comes back during a turn; the Computer is a real process.

The in-process version (a scripted engine in the service) is
tests/computer/test_service.py::test_server_restart_during_a_turn_loses_nothing_and_acks_once;
here the whole chain runs: real Computer, real launcher and sandbox, fake engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import bootstrap_for, launch, machine
from crew_testkit.crew_server_proc import start_crew_server
from tests.faults.chain import dropped_batches, read_positions
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(150)


def test_server_killed_and_restarted_mid_turn_reports_wait_nothing_lost_or_acked_twice(
    tmp_path: Path,
) -> None:
    need_sandbox()
    server = start_crew_server(tmp_path / "srv")
    port = int(server.url.rsplit(":", 1)[1])
    try:
        comp = server.create_computer()
        agent = server.create_agent("restart1", computer_id=comp["computer_id"])
        dm = server.create_room("dm", [agent["id"]])
        with machine() as m:
            m.log_in()
            c = launch(m, bootstrap_for(server.url, comp["token"], m))
            try:
                usable(c)
                work = m.crew_home / "agents" / agent["id"] / "work"
                first = server.post(
                    dm["id"], "slow tool:\nFAKE:RUN sleep 4; touch reached-the-end; echo done"
                )
                wait_until(
                    "the engine running",
                    lambda: any(r["state"] == "running" for r in c.get("/agents")),
                )
                [running] = wait_until("the turn", lambda: server.turns(agent["id"]))
                wait_until("its first event", lambda: server.turn(running["id"])["events"])
                # The server dies (no goodbye) while the engine works.
                server.process.kill()
                server.process.wait(timeout=10)
                server.stop()
                wait_until("the Computer to notice", lambda: not c.get("/health")["connected"])
                # The engine finishes while the server is away: its reports wait (issue 20).
                wait_until("the engine's end", lambda: (work / "reached-the-end").exists())
                server = start_crew_server(tmp_path / "srv", db=server.db, port=port)

                # The ack and the finish waited for the server; the turn ends once.
                [turn] = finished(server, agent["id"], 1)
                assert turn["status"] == "succeeded", turn
                assert read_positions(server, agent["id"])[dm["id"]] == (first["seq"], first["seq"])
                recorded = server.turn(turn["id"])["events"]
                kinds = [e["type"] for e in recorded]
                assert kinds[0] == "step_start" and "tool_use" in kinds, kinds
                assert server.turn(turn["id"])["gaps"] == []
                assert dropped_batches(c) == 0
                assert turn["id"] == running["id"]
                assert c.proc.poll() is None

                # The event stream reconnects: a new message wakes the agent again.
                wait_until("the reconnect", lambda: c.get("/health")["connected"])
                second = server.post(dm["id"], "after the restart")
                turns = finished(server, agent["id"], 2)
                assert [t["status"] for t in turns] == ["succeeded", "succeeded"]
                text = server.turn(turns[1]["id"])["input"]
                assert "after the restart" in text and "slow tool" not in text  # acked once
                assert read_positions(server, agent["id"])[dm["id"]] == (
                    second["seq"],
                    second["seq"],
                )
                assert len(server.turns(agent["id"])) == 2
                assert [x["body"] for x in server.messages(dm["id"])] == [
                    first["body"],
                    second["body"],
                ]
            finally:
                code = c.stop()
            assert code == 0, c.stderr()[-3000:]
    finally:
        server.stop()
