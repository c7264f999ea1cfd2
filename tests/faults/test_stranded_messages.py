"""Messages are not stranded after a transient failure (issue 10, item 5); real processes.

The launcher is killed with SIGKILL in the middle of a turn. The turn fails,
a new launcher takes over, and the runner wakes ITSELF again with backoff: the
message is answered although no other message arrives to wake the agent.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import bootstrap_for, launch, launcher_pids, machine
from tests.faults.chain import read_positions
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(150)


def test_a_launcher_killed_mid_turn_leaves_no_message_unanswered(crew_server: Any) -> None:
    need_sandbox()
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("stranded1", computer_id=comp["computer_id"])
    dm = crew_server.create_room("dm", [agent["id"]])
    with machine() as m:
        m.log_in()
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(c)
            # The first run works long (and is killed); any later run answers at once.
            message = crew_server.post(dm["id"], "think long:\nFAKE:ONCE SLOW 60")
            [running] = wait_until("the turn", lambda: crew_server.turns(agent["id"]))
            # Its first event: the fake engine is under way (and has used up its ONCE).
            wait_until("its first event", lambda: crew_server.turn(running["id"])["events"])
            [launcher] = launcher_pids(c.proc.pid)
            os.kill(launcher, signal.SIGKILL)
            # No other message is posted: the runner must come back by itself.
            turns = finished(crew_server, agent["id"], 2, timeout=90)
            assert turns[0]["status"] == "failed", turns[0]
            assert turns[-1]["status"] == "succeeded", turns[-1]
            positions = read_positions(crew_server, agent["id"])
            assert positions[dm["id"]][1] == message["seq"]
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]
