"""kill -9 of the Computer (or its launcher) right after `crew reply` returned: answered once.

Real processes: crew-server, the Computer with its launcher and sandbox, the fake
engine running the real `crew`. Before issue 22 the restarted Computer's next turn
got the same message again and answered it a second time (the README's accepted
window); now the server reads the room the interrupted turn answered when the
Computer connects again. Counted from the server: the answer is there once.
The same with the real OpenCode in both engines (tests/faults/engines.py), for the
Computer and for its launcher, counted from the database (every message once).
"""

from __future__ import annotations

from typing import Any

import pytest

from crew_harness.waiting import wait_until
from crew_testkit.answer_ledger import Ledger, read_ledger
from crew_testkit.computer_proc import bootstrap_for, launch, machine
from tests.faults.engines import ENGINE_MODES, FaultChain, fault_chain, once_in_work_dir, reply_rule
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(240)


def test_kill_9_of_the_computer_right_after_crew_reply_answers_once(crew_server: Any) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agent = crew_server.create_agent("once1", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [agent["id"]])
        crew_server.post(
            dm["id"],
            f"reply, then wait:\nFAKE:RUN printf 'answered once' | crew reply {dm['id']} && sleep 60",
        )

        def answers() -> list[str]:
            return [
                msg["body"]
                for msg in crew_server.messages(dm["id"])
                if msg["author"]["kind"] == "agent"
            ]

        first = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(first)
            wait_until("the reply posted", lambda: answers() == ["answered once"], 60)
            first.proc.kill()  # kill -9, the ack never goes out
            first.proc.wait(timeout=10)
        finally:
            first.stop()
        second = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(second)
            wait_until(
                "the first turn interrupted",
                lambda: [t["status"] for t in crew_server.turns(agent["id"])] == ["interrupted"],
                60,
            )
            # A later message gets its own turn; the first one must not come back with it.
            crew_server.post(dm["id"], "and now?")
            finished(crew_server, agent["id"], 2, 60)
        finally:
            assert second.stop() == 0, second.stderr()[-3000:]
        assert answers().count("answered once") == 1, answers()


# ---------------------------------------------------------------- the real OpenCode, both engines


def _reply_then_hold(fc: FaultChain, tag: str) -> dict[str, Any]:
    """An agent whose turn on `tag` replies, then (the first time only) holds on for a minute."""
    fc.chain.script(
        [
            reply_rule(tag, f"answered {tag}", then=once_in_work_dir("held", "sleep 60")),
            reply_rule("NEXT", "and next"),
        ]
    )
    agent = fc.chain.agent(f"once{tag.lower()}")
    return fc.chain.dm(agent["id"]) | {"agent": agent}


@pytest.mark.parametrize("engine", ENGINE_MODES)
def test_kill_9_of_the_computer_right_after_crew_reply_answers_once_in_both_engines(
    engine: str,
) -> None:
    with fault_chain(engine) as fc:
        dm = _reply_then_hold(fc, "KILLC")
        fc.chain.post(dm["id"], "KILLC: answer me")
        wait_until("the reply posted", lambda: fc.agent_replies(dm["id"]), 90)
        fc.kill_computer()
        fc.relaunch()
        # A later message gets its own turn; the first must not come back with it.
        fc.chain.post(dm["id"], "NEXT: and now?")
        fc.chain.finished_turns(dm["agent"]["id"], 2)
        fc.answered_once(2)
        fc.chain.check_engine()


@pytest.mark.parametrize("engine", ENGINE_MODES)
def test_kill_9_of_the_launcher_right_after_crew_reply_answers_once_in_both_engines(
    engine: str,
) -> None:
    with fault_chain(engine, retry_base_s=1) as fc:
        dm = _reply_then_hold(fc, "KILLL")
        fc.chain.post(dm["id"], "KILLL: answer me")
        wait_until("the reply posted", lambda: fc.agent_replies(dm["id"]), 90)
        fc.kill_launcher()
        fc.chain.finished_turns(dm["agent"]["id"], 1)
        fc.chain.post(dm["id"], "NEXT: and now?")
        fc.answered_once(2)


# Today the server reads, for the interrupted turn, only its claim (and the agent's own
# answer right after it): a message the turn was shown by a HELD answer and answered
# stays unread, so the next turn is given it and answers it again.
def test_kill_9_after_a_reply_that_answered_a_held_message_answers_both_once(
    crew_server: Any,
) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agent = crew_server.create_agent("onceheld", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [agent["id"]])
        room = dm["id"]
        # First turn: wait for `go`, reply (HELD: the second message came), reply again
        # with the news, then hold on. Any later turn just replies.
        first_turn = (
            "while [ ! -e go ]; do sleep 0.1; done; "
            f"echo one | crew reply {room}; echo one and two | crew reply {room}; sleep 60"
        )
        crew_server.post(
            room,
            f"first\nFAKE:RUN if [ ! -e held ]; then touch held; {first_turn}; "
            f"else echo again | crew reply {room}; fi",
        )
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(c)
            wait_until("the first turn", lambda: crew_server.turns(agent["id"]), 60)
            crew_server.post(room, f"second\nFAKE:RUN echo again | crew reply {room}")
            (m.crew_home / "agents" / agent["id"] / "work" / "go").touch()
            wait_until(
                "the reply after HELD", lambda: "one and two" in _replies(crew_server, room), 60
            )
            c.proc.kill()
            c.proc.wait(timeout=10)
        finally:
            c.stop()
        again = launch(m, bootstrap_for(crew_server.url, comp["token"], m))
        try:
            usable(again)
            ledger = wait_until("the room at rest", lambda: _rested(crew_server, room), 90)
        finally:
            assert again.stop() == 0, again.stderr()[-3000:]
        verdicts = [f.verdict for f in ledger.fates if f.room_id == room]
        assert verdicts == ["once", "once"], (ledger.details(), _replies(crew_server, room))


def _replies(server: Any, room_id: str) -> list[str]:
    return [m["body"] for m in server.messages(room_id) if m["author"]["kind"] == "agent"]


def _rested(server: Any, room_id: str) -> Ledger | None:
    """The database's count once the room's messages are read and no turn of it runs."""
    ledger = read_ledger(server.db)
    mine = [f for f in ledger.fates if f.room_id == room_id]
    return ledger if mine and all(f.read for f in mine) and not ledger.stuck else None
