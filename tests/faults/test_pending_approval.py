"""kill -9 of the Computer while an approval card is pending (issue 24), the real chain
(warm engine, real OpenCode, the scripted model): the card ends `expired` when the new
Computer connects, the message comes back to the next turn (a new card, answered), and
the command ran exactly once.
"""

from __future__ import annotations

import pytest

from crew_harness.waiting import wait_until
from tests.e2e.test_chain import REPLY_ROOM, having, heredoc
from tests.faults.engines import fault_chain

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

POLICY = {
    "preset": "autonomous",
    "rules": [{"tool": "bash", "pattern": "touch *", "action": "ask"}],
    "ask_timeout_s": 300,
}


def test_a_card_pending_when_the_computer_is_killed_expires_and_the_command_runs_once() -> None:
    with fault_chain("warm") as fc:
        chain = fc.chain
        chain.script(
            [
                {
                    "role": "user",
                    "match": having("PENDING"),
                    "reply": {"bash": "touch made.txt && echo RUN >> runs.log && echo MADE"},
                },
                {
                    "role": "tool",
                    "match": r"MADE",
                    "capture": {"room": REPLY_ROOM},
                    "reply": {"bash": heredoc("{{room}}", "RAN IT")},
                },
            ]
        )
        ada = chain.agent("ada-pending", permission=POLICY)
        room = chain.dm(ada["id"])
        chain.post(room["id"], "PENDING: make the file")

        def pending() -> list[dict]:
            cards = chain.expect_ok(chain.http.get("/api/approvals", params={"state": "pending"}))
            return [c for c in cards if c["agent_id"] == ada["id"]]

        [first] = wait_until("the first card", pending, 90)
        fc.kill_computer()
        fc.relaunch()
        # The new Computer's connection ends the old turn's card; its message comes back
        # and the next turn asks again with a card of its own.
        expired = wait_until(
            "the first card expired",
            lambda: (
                (c := chain.expect_ok(chain.http.get(f"/api/approvals/{first['id']}")))["state"]
                == "expired"
                and c
            ),
            60,
        )
        assert expired["turn_id"] == first["turn_id"]
        refused = chain.http.post(f"/api/approvals/{first['id']}", json={"decision": "once"})
        assert refused.status_code == 409, refused.text
        [second] = wait_until(
            "a new card", lambda: [c for c in pending() if c["id"] != first["id"]], 90
        )
        assert second["turn_id"] != first["turn_id"]
        chain.expect_ok(
            chain.http.post(f"/api/approvals/{second['id']}", json={"decision": "once"})
        )
        wait_until("the reply", lambda: fc.agent_replies(room["id"]), 90)
        fc.answered_once(1)
        runs = (fc.work_dir(ada["id"]) / "runs.log").read_text().splitlines()
        assert runs == ["RUN"], runs
