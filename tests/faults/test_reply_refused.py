"""A turn whose `crew reply` was refused is not a success (issue 10); real processes.

Before issue 10 the engine exiting 0 was enough: a turn whose agent tried to
answer and was refused (not a member of the room, a broken token, a HELD
reply never sent again, the server down) was recorded `succeeded` and its
messages marked read — the user never got an answer, and nothing said so.
Now the runner reads the agent's `crew reply` calls from the turn's own
engine events: a refusal that no later `crew reply` to that room cleared
makes the turn `failed` with the class `reply_refused`, without an ack, and
the message comes back. A refusal followed by a reply that gets through is
a success.
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

# Long enough to read the positions between the first failures and the third (set aside).
RETRY_BASE_S = 3.0


def test_a_reply_refused_every_time_fails_the_turn_and_the_message_comes_back(
    crew_server: Any,
) -> None:
    need_sandbox()
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("refused1", computer_id=comp["computer_id"])
    dm = crew_server.create_room("dm", [agent["id"]])
    stranger = crew_server.create_agent("stranger1")
    elsewhere = crew_server.create_room("dm", [stranger["id"]])
    with machine() as m:
        m.log_in()
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m, retry_base_s=RETRY_BASE_S))
        try:
            usable(c)
            # The agent answers into a room it is not a member of: refused, every time.
            message = crew_server.post(
                dm["id"], f"answer me\nFAKE:RUN echo hi | crew reply {elsewhere['id']}"
            )
            first, second = finished(crew_server, agent["id"], 2, timeout=60)
            # Not marked read: the third failure (which sets it aside) is seconds away.
            assert read_positions(crew_server, agent["id"])[dm["id"]][1] < message["seq"]
            for turn in (first, second):
                record = crew_server.turn(turn["id"])
                assert record["status"] == "failed", record
                assert record["failure"]["class"] == "reply_refused", record
                assert "answer me" in record["input"]  # it came back
            assert crew_server.messages(elsewhere["id"]) == []
            # The third refusal sets it aside (the room is told), and the turn is failed.
            turns = finished(crew_server, agent["id"], 3, timeout=60)
            assert [t["status"] for t in turns] == ["failed"] * 3
            wait_until(
                "the set-aside notice",
                lambda: any(
                    x["body"].startswith("@refused1 could not handle 1 message here")
                    and "reply_refused: " in x["body"]
                    for x in crew_server.messages(dm["id"])
                ),
            )
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]


def test_a_refused_reply_sent_again_successfully_is_a_success(crew_server: Any) -> None:
    need_sandbox()
    comp = crew_server.create_computer()
    agent = crew_server.create_agent("refused2", computer_id=comp["computer_id"])
    dm = crew_server.create_room("dm", [agent["id"]])
    with machine() as m:
        m.log_in()
        c = launch(m, bootstrap_for(crew_server.url, comp["token"], m, retry_base_s=RETRY_BASE_S))
        try:
            usable(c)
            # The first `crew reply` reads a token file that is not there; the second works.
            message = crew_server.post(
                dm["id"],
                "answer me\nFAKE:RUNS "
                f"echo first | CREW_TOKEN_FILE=/nonexistent crew reply {dm['id']}"
                f" ;; echo second | crew reply {dm['id']}",
            )
            [turn] = finished(crew_server, agent["id"], 1, timeout=60)
            record = crew_server.turn(turn["id"])
            assert record["status"] == "succeeded", record
            tools = [e["data"] for e in record["events"] if e["type"] == "tool_use"]
            assert len(tools) == 2, tools
            replies = [
                x["body"] for x in crew_server.messages(dm["id"]) if x["author"]["kind"] == "agent"
            ]
            assert replies == ["second"]
            delivered, read = read_positions(crew_server, agent["id"])[dm["id"]]
            assert read == delivered >= message["seq"]  # (its own reply counts as seen)
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]
