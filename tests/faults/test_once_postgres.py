"""Answered once over PostgreSQL, two server processes, the Computer's stream moved (issue 22).

The real OpenCode in both engines (tests/faults/engines.py). Two `crew-server`
processes share one PostgreSQL database; the Computer, and the `crew` of its
sandboxes, reach them through a proxy that first forwards to one and then moves
every connection (the event stream included) to the other. Each test counts from
the database: every message answered exactly once.
"""

from __future__ import annotations

import pytest

from crew_harness.waiting import wait_until
from crew_testkit.postgres import PostgresCluster
from tests.faults.engines import ENGINE_MODES, FaultChain, fault_chain, once_in_work_dir, reply_rule

pytestmark = pytest.mark.timeout(240)


def _port(fc: FaultChain, n: int) -> int:
    return int(fc.servers[n].url.rsplit(":", 1)[1])


@pytest.mark.parametrize("engine", ENGINE_MODES)
def test_a_lost_reply_answer_retried_on_the_other_server_answers_once(
    engine: str, postgres_cluster: PostgresCluster
) -> None:
    """The first server takes the reply, its answer is lost, and at that moment every
    connection moves to the second: `crew`'s retry with the same key lands there, the
    ack too. The dedupe holds across the processes."""
    db = postgres_cluster.new_database()
    with fault_chain(engine, db=db, servers=2, through_proxy=True) as fc:
        assert fc.proxy is not None
        fc.chain.script([reply_rule("MOVED", "Shipped.")])
        agent = fc.chain.agent("pgmoved")
        dm = fc.chain.dm(agent["id"])
        fc.proxy.drop(b"POST /agent/reply ", switch_to=_port(fc, 1))
        fc.chain.post(dm["id"], "MOVED: did it ship?")
        [turn] = fc.chain.finished_turns(agent["id"], 1)
        assert len(fc.proxy.dropped) == 1, fc.proxy.forwarded
        assert turn["status"] == "succeeded", (turn["failure"], fc.chain.diagnostics())
        fc.answered_once(1)
        assert fc.agent_replies(dm["id"]) == ["Shipped."]
        fc.chain.check_engine()


@pytest.mark.parametrize("engine", ENGINE_MODES)
def test_kill_9_of_the_computer_after_crew_reply_and_the_new_one_on_the_other_server(
    engine: str, postgres_cluster: PostgresCluster
) -> None:
    """The reply lands through the first server, the Computer is killed (-9) and the
    next one connects through the second: the interrupted turn's room is read there."""
    db = postgres_cluster.new_database()
    with fault_chain(engine, db=db, servers=2, through_proxy=True) as fc:
        assert fc.proxy is not None
        fc.chain.script(
            [
                reply_rule("PGKILL", "answered", then=once_in_work_dir("held", "sleep 60")),
                reply_rule("NEXT", "and next"),
            ]
        )
        agent = fc.chain.agent("pgkill")
        dm = fc.chain.dm(agent["id"])
        fc.chain.post(dm["id"], "PGKILL: answer me")
        wait_until("the reply posted", lambda: fc.agent_replies(dm["id"]), 90)
        fc.kill_computer()
        fc.proxy.switch(_port(fc, 1))
        fc.relaunch()
        fc.chain.post(dm["id"], "NEXT: and now?")
        fc.chain.finished_turns(agent["id"], 2)
        fc.answered_once(2)
        assert fc.agent_replies(dm["id"]) == ["answered", "and next"]
