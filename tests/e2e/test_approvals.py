"""Approvals through the whole chain (issue 24): crew-server, a warm Computer, the real
OpenCode in its sandbox and the scripted model; the person answers through the user API.

An `ask` rule on `touch *`: the card appears in the room the turn's message came from,
the turn waits, and what the person answers is what happens — Allow once runs the
command and the turn succeeds; Deny leaves no file and the agent replies that it could
not; Always runs the next identical call without a card and shows in the policy; an
answer for a card whose turn ended is refused (409 `approval_closed`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crew_harness.waiting import WaitTimeout, wait_until
from tests.e2e.chain import Chain, running_chain
from tests.e2e.test_chain import REPLY_ROOM, having, heredoc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ASK_TOUCH = {
    "preset": "autonomous",
    "rules": [{"tool": "bash", "pattern": "touch *", "action": "ask"}],
    "ask_timeout_s": 120,
}


def touch_rules(tag: str, name: str, ran: str, could_not: str) -> list[dict[str, Any]]:
    """Model rules: a turn with `tag` runs `touch name`; the tool's result decides the reply
    (`ran`, or `could_not` where `{{why}}` is the refusal's reason)."""
    return [
        {"role": "user", "match": having(tag), "reply": {"bash": f"touch {name} && echo MADE"}},
        {
            "role": "tool",
            "match": r"MADE",
            "capture": {"room": REPLY_ROOM},
            "reply": {"bash": heredoc("{{room}}", ran)},
        },
        {
            "role": "tool",
            "match": r"Not allowed: (?P<why>[^.\n]*)",
            "capture": {"room": REPLY_ROOM},
            "reply": {"bash": heredoc("{{room}}", could_not)},
        },
    ]


def script_for(chain: Chain, tag: str, name: str) -> None:
    chain.script(touch_rules(tag, name, f"RAN IT {tag}", f"COULD NOT {tag}: {{{{why}}}}"))


@pytest.fixture(scope="module")
def warm() -> Iterator[Chain]:
    with running_chain(engine_mode="warm") as started:
        yield started


def asking_agent(
    chain: Chain, handle: str, permission: dict[str, Any] = ASK_TOUCH
) -> dict[str, Any]:
    """An agent created with `permission`: its first turn already asks."""
    return chain.agent(handle, permission=permission)


def pending_card(chain: Chain, agent_id: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        cards = chain.expect_ok(chain.http.get("/api/approvals", params={"state": "pending"}))
        return next((c for c in cards if c["agent_id"] == agent_id), None)

    try:
        return wait_until("an approval card", probe, 90)
    except WaitTimeout:
        turns = [(t["status"], t["failure"]) for t in chain.turns(agent_id)]
        pytest.fail(f"no approval card; the agent's turns: {turns}\n{chain.diagnostics()}")


def work(chain: Chain, agent_id: str) -> Path:
    return chain.crew_home / "agents" / agent_id / "work"


def test_allow_once_runs_the_command_and_the_turn_succeeds(warm: Chain) -> None:
    ada = asking_agent(warm, "ada-once")
    room = warm.dm(ada["id"])
    script_for(warm, "ONCE", "once.txt")
    warm.post(room["id"], "ONCE: make the file")
    card = pending_card(warm, ada["id"])
    assert card["room_id"] == room["id"] and "touch once.txt" in card["summary"], card
    # The card is in the room, and nothing ran while it waits.
    [shown] = [m for m in warm.messages(room["id"]) if m.get("approval")]
    assert shown["approval"]["id"] == card["id"] and shown["approval"]["state"] == "pending"
    assert not (work(warm, ada["id"]) / "once.txt").exists()

    answered = warm.http.post(f"/api/approvals/{card['id']}", json={"decision": "once"})
    assert warm.expect_ok(answered)["state"] == "allowed"
    [turn] = warm.finished_turns(ada["id"], 1)
    assert turn["status"] == "succeeded", (turn["failure"], warm.diagnostics())
    assert (work(warm, ada["id"]) / "once.txt").exists()
    replies = [m["body"] for m in warm.agent_messages(room["id"], ada["id"])]
    assert replies == ["RAN IT ONCE"]
    kinds = [e["type"] for e in turn["events"]]
    assert "approval_asked" in kinds and "approval_answered" in kinds, kinds

    # The card's turn is over: another answer is refused, nothing changes.
    again = warm.http.post(f"/api/approvals/{card['id']}", json={"decision": "deny"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "approval_closed", (
        again.text
    )


def test_deny_leaves_no_file_and_the_agent_says_it_could_not(warm: Chain) -> None:
    bea = asking_agent(warm, "bea-deny")
    room = warm.dm(bea["id"])
    script_for(warm, "DENY", "denied.txt")
    warm.post(room["id"], "DENY: make the file")
    card = pending_card(warm, bea["id"])
    warm.expect_ok(warm.http.post(f"/api/approvals/{card['id']}", json={"decision": "deny"}))
    [turn] = warm.finished_turns(bea["id"], 1)
    assert turn["status"] == "succeeded", (turn["failure"], warm.diagnostics())
    assert not (work(warm, bea["id"]) / "denied.txt").exists()
    [reply] = [m["body"] for m in warm.agent_messages(room["id"], bea["id"])]
    assert reply.startswith("COULD NOT DENY:"), reply


def test_always_adds_a_rule_and_the_next_identical_call_runs_without_a_card(warm: Chain) -> None:
    cyd = asking_agent(warm, "cyd-always")
    room = warm.dm(cyd["id"])
    script_for(warm, "ALWAYS", "always.txt")
    warm.post(room["id"], "ALWAYS: make the file")
    card = pending_card(warm, cyd["id"])
    warm.expect_ok(warm.http.post(f"/api/approvals/{card['id']}", json={"decision": "always"}))
    warm.finished_turns(cyd["id"], 1)
    agents = warm.expect_ok(warm.http.get("/api/agents"))
    [policy] = [a["permission"] for a in agents if a["id"] == cyd["id"]]
    assert any(r["action"] == "allow" and r["tool"] == "bash" for r in policy["rules"]), policy

    (work(warm, cyd["id"]) / "always.txt").unlink()
    warm.post(room["id"], "ALWAYS: and once more")
    turns = warm.finished_turns(cyd["id"], 2)
    assert turns[1]["status"] == "succeeded", (turns[1]["failure"], warm.diagnostics())
    assert (work(warm, cyd["id"]) / "always.txt").exists()
    cards = warm.expect_ok(warm.http.get("/api/approvals"))
    assert [c["id"] for c in cards if c["agent_id"] == cyd["id"]] == [card["id"]]


def test_no_answer_within_the_limit_denies_and_the_card_says_expired(warm: Chain) -> None:
    dot = asking_agent(warm, "dot-silent", {**ASK_TOUCH, "ask_timeout_s": 10})
    room = warm.dm(dot["id"])
    script_for(warm, "SILENT", "silent.txt")
    warm.post(room["id"], "SILENT: make the file")
    card = pending_card(warm, dot["id"])
    [turn] = warm.finished_turns(dot["id"], 1)
    assert turn["status"] == "succeeded", (turn["failure"], warm.diagnostics())
    assert not (work(warm, dot["id"]) / "silent.txt").exists()
    [reply] = [m["body"] for m in warm.agent_messages(room["id"], dot["id"])]
    assert reply.startswith("COULD NOT SILENT:") and "no answer" in reply, reply
    closed = warm.expect_ok(warm.http.get(f"/api/approvals/{card['id']}"))
    assert closed["state"] == "expired", closed
