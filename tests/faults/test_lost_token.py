"""An agent's token whose answer is lost as the Computer starts: its waiting message is answered.

Real processes: crew-server, the Computer with its launcher and sandbox, the fake
engine running the real `crew`; the Computer reaches the server through a
`ForwardingProxy` that loses the answer of the agent's first
`POST /computer/agents/<id>/token`. The event stream stays open, so no event syncs
the agents again: before the fix the agent got no runner and its message waited for
good (the small chaos run in CI, where a new Computer's first sync met the server's
full disk). Now the Computer syncs again by itself, with backoff.
"""

from __future__ import annotations

from typing import Any

import pytest

from crew_testkit.computer_proc import bootstrap_for, launch, machine
from tests.faults.chain import read_positions
from tests.faults.forwarding_proxy import ForwardingProxy
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(120)


def test_a_lost_token_answer_at_start_still_answers_the_waiting_message(crew_server: Any) -> None:
    need_sandbox()
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("losttoken1", computer_id=comp["computer_id"])
    dm = crew_server.create_room("dm", [agent["id"]])
    message = crew_server.post(
        dm["id"], f"waiting since before the start\nFAKE:RUN echo answered | crew reply {dm['id']}"
    )
    proxy = ForwardingProxy(int(crew_server.url.rsplit(":", 1)[1]))
    token_call = f"POST /computer/agents/{agent['id']}/token ".encode()
    proxy.drop(token_call)
    try:
        with machine() as m:
            m.log_in()
            c = launch(m, bootstrap_for(proxy.url, comp["token"], m, retry_base_s=1))
            try:
                usable(c)
                # No post, no agent change: nothing but the Computer itself may sync again.
                [turn] = finished(crew_server, agent["id"], 1, timeout=40)
                assert turn["status"] == "succeeded", (turn, c.stderr()[-3000:])
                assert [line for line in proxy.dropped if line.startswith(token_call)], proxy
                replies = [
                    x["body"]
                    for x in crew_server.messages(dm["id"])
                    if x["author"]["kind"] == "agent"
                ]
                assert replies == ["answered"]
                delivered, read = read_positions(crew_server, agent["id"])[dm["id"]]
                assert delivered == read >= message["seq"]
            finally:
                assert c.stop() == 0, c.stderr()[-3000:]
    finally:
        proxy.close()
