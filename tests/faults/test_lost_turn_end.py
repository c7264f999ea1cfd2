"""A turn whose end never reached the server still ends.

The runner's ack and finish give up after ~3 s each while the server is down,
and a registration whose answer is lost leaves a turn the Computer never
knew. The messages come back at the next wake (nothing lost), and the server
interrupts an agent's turn still `running` when the next one is registered,
so no turn stays `running` for good (quality.md: "the turn ends").
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import bootstrap_for, launch, machine
from crew_testkit.crew_server_proc import start_crew_server
from tests.faults.chain import read_positions, wake_event
from tests.faults.sse_proxy import SSEProxy
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(150)


def test_a_long_outage_at_the_end_of_a_turn_still_ends_the_turn(tmp_path: Path) -> None:
    need_sandbox()
    server = start_crew_server(tmp_path / "srv")
    port = int(server.url.rsplit(":", 1)[1])
    try:
        comp = server.create_computer()
        agent = server.create_agent("outage1", computer_id=comp["computer_id"])
        dm = server.create_room("dm", [agent["id"]])
        with machine() as m:
            m.log_in()
            # The ack and the finish each give up after 3 s (the default is 60 s).
            c = launch(m, bootstrap_for(server.url, comp["token"], m, upstream_retry_window_s=3))
            try:
                usable(c)
                work = m.crew_home / "agents" / agent["id"] / "work"
                first = server.post(dm["id"], "slow:\nFAKE:RUN sleep 2; touch reached-the-end")
                [running] = wait_until("the turn", lambda: server.turns(agent["id"]))
                server.process.kill()
                server.process.wait(timeout=10)
                server.stop()
                wait_until("the engine's end", lambda: (work / "reached-the-end").exists())
                # Longer than the ack's and the finish's retry windows together.
                wait_until(
                    "the runner to give up",
                    lambda: any(r["state"] == "idle" for r in c.get("/agents")),
                    60,
                )
                time.sleep(1)
                server = start_crew_server(tmp_path / "srv", db=server.db, port=port)
                wait_until("the reconnect", lambda: c.get("/health")["connected"], 60)
                # Nothing lost: the message comes back and is handled.
                done = finished(server, agent["id"], 2, timeout=60)
                assert [t["status"] for t in done] == ["interrupted", "succeeded"]
                assert read_positions(server, agent["id"])[dm["id"]] == (first["seq"],) * 2
                # …and the first turn ended (it is not `running` forever).
                status = server.turn(running["id"])["status"]
                assert status != "running", status
            finally:
                assert c.stop() == 0, c.stderr()[-3000:]
    finally:
        server.stop()


def test_a_garbled_turn_registration_does_not_leave_a_running_turn(crew_server: Any) -> None:
    """The server registered the turn, its answer got lost: that turn never ends either."""
    need_sandbox()
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("garbledturn1", computer_id=comp["computer_id"])
    dm = crew_server.create_room("dm", [agent["id"]])
    proxy = SSEProxy(crew_server.url).start()
    with machine() as m:
        m.log_in()
        c = launch(m, bootstrap_for(proxy.url, comp["token"], m))
        try:
            usable(c)
            wait_until("the event stream", lambda: proxy.streams)
            proxy.garble("POST", "/turns")
            crew_server.post(dm["id"], "registered but garbled")
            proxy.inject(wake_event(agent["id"]))
            wait_until(
                "the failed registration", lambda: "registering the turn failed" in c.stderr()
            )
            proxy.inject(wake_event(agent["id"]))
            turns = finished(crew_server, agent["id"], 2)
            assert [t["status"] for t in turns] == ["interrupted", "succeeded"]
            statuses = [t["status"] for t in crew_server.turns(agent["id"])]
            assert "running" not in statuses, statuses
        finally:
            c.stop()
            proxy.stop()
