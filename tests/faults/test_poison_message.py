"""A message no turn can handle does not block the ones after it (issue 10); real processes.

Before issue 10 a failed turn was not tried again by itself, and when it was,
the next claim held the same messages: one message on which the engine
crashed every time kept every later message of the agent unanswered for good.
Now the runner narrows its claim to the oldest message, sets it aside after
the third failure on it (a notice in the room says so), and the later ones
flow. A failure of the environment (here the provider refusing the login)
is no fault of the messages: they are kept, never set aside, and tried again
by the runner itself, without a new message to wake it.
"""

from __future__ import annotations

from typing import Any

import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import bootstrap_for, launch, machine
from tests.faults.chain import read_positions
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(150)

# The runner's first wait before trying again (5 s in use); doubles at each failure.
RETRY_BASE_S = 0.2


def _head(message: dict[str, Any]) -> str:
    """A message's first line: how it shows in a turn's input (later lines are indented)."""
    return str(message["body"]).splitlines()[0]


def _notices(server: Any, room_id: str) -> list[str]:
    return [m["body"] for m in server.messages(room_id) if m["author"]["kind"] == "system"]


def _row(c: Any, agent_id: str) -> dict[str, Any] | None:
    """The agent's `/agents` row; None until the Computer has its runner."""
    return next((r for r in c.get("/agents") if r["id"] == agent_id), None)


def _settled_row(c: Any, agent_id: str) -> dict[str, Any] | None:
    """The agent's row once it waits for nothing: idle, no retry due, no wake pending."""
    row = _row(c, agent_id)
    if row is None:
        return None
    quiet = row["state"] == "idle" and row["retry_at"] is None and not row["pending_wake"]
    return row if quiet else None


def test_a_message_failing_every_turn_is_set_aside_and_the_later_ones_are_answered(
    crew_server: Any,
) -> None:
    need_sandbox()
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("poison1", computer_id=comp["computer_id"])
    dm = crew_server.create_room("dm", [agent["id"]])
    # All four wait before the Computer starts, so the first turn claims them all;
    # the engine obeys the first marker of its input: the poison's.
    poison = crew_server.post(dm["id"], "this one breaks the engine\nFAKE:CRASH")
    later = [
        crew_server.post(dm["id"], f"later {n}\nFAKE:RUN echo answered | crew reply {dm['id']}")
        for n in (1, 2, 3)
    ]
    with machine() as m:
        m.log_in()
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m, retry_base_s=RETRY_BASE_S))
        try:
            usable(c)
            turns = finished(crew_server, agent["id"], 4, timeout=60)
            row = wait_until("the runner to settle", lambda: _settled_row(c, agent["id"]))
            turns = [crew_server.turn(t["id"]) for t in crew_server.turns(agent["id"])][::-1]
            assert [t["status"] for t in turns] == ["failed"] * 3 + ["succeeded"], turns
            assert {t["failure"]["class"] for t in turns[:3]} == {"process_crashed"}
            # Tried again alone (the claim narrowed to it), then set aside.
            assert all(_head(later[0]) not in t["input"] for t in turns[1:3])
            assert all(_head(poison) in t["input"] for t in turns[:3])
            assert _head(poison) not in turns[3]["input"]
            [notice] = _notices(crew_server, dm["id"])
            assert notice.startswith(
                "@poison1 could not handle 1 message here and set it aside unanswered: "
                "process_crashed: "
            ), notice
            # Each later message is answered once, by the one turn that succeeded.
            for message in later:
                handled = [t for t in turns if _head(message) in t["input"]]
                assert [t["status"] for t in handled if t["status"] == "succeeded"] == ["succeeded"]
            messages = crew_server.messages(dm["id"])
            replies = [x["body"] for x in messages if x["author"]["kind"] == "agent"]
            assert replies == ["answered"]
            # Nothing left unread, nothing more to do.
            delivered, read = read_positions(crew_server, agent["id"])[dm["id"]]
            assert read == delivered >= later[-1]["seq"]
            others = [x for x in messages if x["seq"] > read and x["author"]["kind"] != "agent"]
            assert others == [], others
            assert row["last_result"] == "succeeded"
            assert len(crew_server.turns(agent["id"])) == 4
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]


def test_an_environment_failure_keeps_the_message_and_retries_it_by_itself(
    crew_server: Any,
) -> None:
    need_sandbox()
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("envfail1", computer_id=comp["computer_id"])
    dm = crew_server.create_room("dm", [agent["id"]])
    with machine() as m:
        m.log_in()
        # Longer waits than the poison's: the row is read while a retry is due (the four
        # backoffs, 0.5 + 1 + 2 + 4 s, give it four chances).
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m, retry_base_s=0.5))
        try:
            usable(c)
            # More failures than it takes to set a message aside: the provider refuses
            # the login four times, then takes it. No other message is ever posted.
            message = crew_server.post(dm["id"], "hello\nFAKE:TIMES 4 401")

            def waiting_to_retry() -> dict[str, Any] | None:
                row = _row(c, agent["id"])
                if row is None:
                    return None  # the Computer has not listed its agents yet
                due = row["retry_at"] and row["last_result"] == "failed"
                return row if due and "HTTP 401" in (row["last_reason"] or "") else None

            row = wait_until("a retry due after the 401", waiting_to_retry)
            assert "opencode auth login" in row["last_reason"], row
            turns = finished(crew_server, agent["id"], 5, timeout=90)
            wait_until("the runner to settle", lambda: _settled_row(c, agent["id"]))
            turns = [crew_server.turn(t["id"]) for t in crew_server.turns(agent["id"])][::-1]
            assert [t["status"] for t in turns] == ["failed"] * 4 + ["succeeded"], turns
            assert {t["failure"]["class"] for t in turns[:4]} == {"not_logged_in"}
            assert all(_head(message) in t["input"] for t in turns)
            # Kept, never set aside: no notice, and read only after the success.
            assert _notices(crew_server, dm["id"]) == []
            assert read_positions(crew_server, agent["id"])[dm["id"]] == (message["seq"],) * 2
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]
