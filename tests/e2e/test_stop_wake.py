"""A person's Stop and Wake through the whole chain (issue 25): crew-server, the Computer,
the real OpenCode in bwrap and the scripted model, warm and cold.

The agent runs a long `sleep` in its tool; the person's Stop (POST
/api/agents/{id}/stop) reaches the Computer on its stream, the engine really stops
(the tool's process is gone), the turn ends `cancelled`, its message is unread again
and the room says the agent stopped; the agent does not run again by itself. The
person's Wake (POST /api/agents/{id}/wake) then runs a turn that answers the message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crew_harness.waiting import wait_until
from tests.e2e.chain import Chain
from tests.e2e.test_chain import having, heredoc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# A tool that runs far longer than the test waits for anything (its own number, so the
# test can find its process and see it gone).
LONG_TOOL = "sleep 347"


def long_tool_rules(tag: str) -> list[dict[str, Any]]:
    """The model runs the long tool for a message with `tag`."""
    return [{"role": "user", "match": having(tag), "reply": {"bash": f"{LONG_TOOL} && echo SLEPT"}}]


def answer_rules(tag: str, answer: str) -> list[dict[str, Any]]:
    """The model answers a message with `tag` at once."""
    return [{"role": "user", "match": having(tag), "reply": {"bash": heredoc("{{room}}", answer)}}]


def long_tool_running() -> bool:
    """Whether a process of the long tool runs on this machine (any sandbox)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().split(b"\0")[:2] == LONG_TOOL.encode().split():
                return True
        except OSError:
            continue  # the process ended while we looked
    return False


def running_turn(chain: Chain, agent_id: str) -> dict[str, Any]:
    """The agent's running turn, once its tool runs."""

    def probe() -> dict[str, Any] | None:
        running = [t for t in chain.turns(agent_id) if t["status"] == "running"]
        return running[0] if running and long_tool_running() else None

    return wait_until("the long tool running in a turn", probe, 90)


def stop_and_see_it_stopped(chain: Chain, agent: dict[str, Any], room: dict[str, Any]) -> None:
    """Stop the agent's running turn: it ends cancelled, the tool is gone, the message is
    unread, the room says so, and nothing runs again by itself."""
    turn = running_turn(chain, agent["id"])
    answer = chain.http.post(f"/api/agents/{agent['id']}/stop", json={"turn_id": turn["id"]})
    assert answer.status_code == 202, answer.text
    [stopped] = chain.finished_turns(agent["id"], 1, timeout=30)
    assert stopped["status"] == "cancelled", (stopped["failure"], chain.diagnostics())
    assert stopped["failure"]["class"] == "stopped"
    wait_until("the long tool's process gone", lambda: not long_tool_running(), 15)
    [position] = [
        p
        for p in chain.expect_ok(chain.http.get(f"/api/agents/{agent['id']}/positions"))
        if p["room_id"] == room["id"]
    ]
    assert position["read_seq"] == 0, position  # the message comes back unread
    notices = [m["body"] for m in chain.messages(room["id"]) if m["author"]["kind"] == "system"]
    assert notices == [
        f"@{agent['handle']} stopped (you asked); your messages wait unread until you Wake it"
    ]

    # The runner has nothing scheduled: no retry, no wake pending (it says so itself; it
    # is idle only a moment after the server recorded the finish).
    def settled() -> dict[str, Any] | None:
        with chain.computer.introspection() as local:
            row: dict[str, Any] = local.get(f"/agents/{agent['id']}").json()
        return row if row["state"] == "idle" else None

    row = wait_until("the runner idle", settled, 15)
    assert (row["pending_wake"], row["retry_at"], row["last_result"]) == (False, None, "cancelled")
    assert len(chain.turns(agent["id"])) == 1


def test_stop_ends_the_turn_and_wake_answers_the_message(chain: Chain) -> None:
    tag = f"STOP-{chain.engine_mode}"
    chain.script(long_tool_rules(tag))
    ada = chain.agent(f"ada-stop-{chain.engine_mode}")
    room = chain.dm(ada["id"])
    chain.post(room["id"], f"{tag} run the long job")
    stop_and_see_it_stopped(chain, ada, room)
    chain.script(answer_rules(tag, "Done, after the wake."))
    answer = chain.http.post(f"/api/agents/{ada['id']}/wake")
    assert answer.status_code == 202, answer.text
    turns = chain.finished_turns(ada["id"], 2)
    assert [t["status"] for t in turns] == ["cancelled", "succeeded"], chain.diagnostics()
    assert f"{tag} run the long job" in turns[1]["input"]
    assert [m["body"] for m in chain.agent_messages(room["id"], ada["id"])] == [
        "Done, after the wake."
    ]
