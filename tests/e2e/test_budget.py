"""Budgets per agent (issue 24) through the real processes: crew-server, the Computer, the
scripted model (each step costs $0.000144 by its price table) and the real OpenCode.

An agent whose daily cap is below one turn's cost answers once; that turn reaches the cap
and the room gets the 100 % notice. Its next message is not answered: the server's claim
hands out nothing, the Computer shows the hold, the message stays unread, no turn runs.
Raising the cap wakes it and it answers the waiting message.
"""

from __future__ import annotations

from typing import Any

import pytest

from computer_service.watch import read_status, socket_path
from crew_harness.waiting import wait_until
from tests.e2e.chain import Chain
from tests.e2e.test_chain import having, heredoc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def computer_row(chain: Chain, agent_id: str) -> dict[str, Any]:
    """The agent's row on the Computer's introspection socket (`GET /agents`)."""
    rows = read_status(socket_path(chain.crew_home))["agents"]
    return dict(next(r for r in rows if r["id"] == agent_id))


def test_an_agent_at_its_cap_waits_with_a_notice_and_answers_when_the_cap_is_raised(
    chain: Chain,
) -> None:
    chain.script(
        [
            {
                "role": "user",
                "match": having(tag),
                "reply": {"bash": heredoc("{{room}}", f"answered {tag}")},
            }
            for tag in ("BUDGET-1", "BUDGET-2")
        ]
    )
    ada = chain.agent("ada-budget")
    capped = chain.http.patch(f"/api/agents/{ada['id']}", json={"budget": {"daily_usd": 0.0002}})
    chain.expect_ok(capped)
    room = chain.dm(ada["id"])
    chain.post(room["id"], "BUDGET-1: hello")
    [first] = chain.finished_turns(ada["id"], 1)
    assert first["status"] == "succeeded", (first["failure"], chain.diagnostics())
    assert first["usage"]["cost"] >= 0.0002  # two steps: the cap is reached

    notices = [m["body"] for m in chain.messages(room["id"]) if m["kind"] == "notice"]
    assert len(notices) == 1 and notices[0].startswith(
        "@ada-budget reached its daily budget ($0.0002); its messages wait until 00:00 UTC on"
    ), notices

    waiting = chain.post(room["id"], "BUDGET-2: are you there?")
    # The server wakes the agent for it; the Computer's claim is answered with the hold.
    wait_until(
        "the Computer shows the budget hold",
        lambda: (computer_row(chain, ada["id"])["held"] or "").startswith("budget until "),
        timeout=60,
    )
    row = computer_row(chain, ada["id"])
    assert row["state"] == "idle" and row["retry_at"] is None, row
    assert len(chain.turns(ada["id"])) == 1
    [shown] = [a for a in chain.expect_ok(chain.http.get("/api/agents")) if a["id"] == ada["id"]]
    assert shown["status"] == "budget" and shown["budget_state"]["until"] is not None
    positions = chain.expect_ok(chain.http.get(f"/api/agents/{ada['id']}/positions"))
    [position] = [p for p in positions if p["room_id"] == room["id"]]
    assert position["read_seq"] < waiting["seq"] and position["delivered_seq"] < waiting["seq"]

    raised = chain.http.patch(f"/api/agents/{ada['id']}", json={"budget": {"daily_usd": 1}})
    chain.expect_ok(raised)
    turns = chain.finished_turns(ada["id"], 2)
    assert turns[1]["status"] == "succeeded", (turns[1]["failure"], chain.diagnostics())
    assert "BUDGET-2: are you there?" in turns[1]["input"]
    replies = [m["body"] for m in chain.agent_messages(room["id"], ada["id"])]
    assert replies == ["answered BUDGET-1", "answered BUDGET-2"]
    wait_until(
        "the hold is gone on the Computer",
        lambda: computer_row(chain, ada["id"])["held"] is None,
        timeout=30,
    )
