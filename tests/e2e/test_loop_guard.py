"""Issue 24's loop test through the real processes: the demo's two agents in a group, with
a scripted model that answers every message (each agent replies to whatever it is given),
stop at the room's hop limit with exactly one notice; the user's next message starts them
again and they stop again. Counted from the server's database.

Before the loop guard this pair wrote 116 messages in 30 s and went on until one was muted.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from crew_harness.scripted_model import ROOM_ID
from crew_harness.waiting import wait_until
from crew_server import rules
from tests.e2e.chain import Chain

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PAUSED = "Agents paused here until someone writes"
HOPS = rules.HOP_LIMIT_DEFAULT
AGENTS = 2

ALWAYS_ANSWER = [
    # A HELD answer: send again (one message still).
    {
        "role": "tool",
        "match": r"Not sent: new messages arrived",
        "capture": {"room": rf"crew reply ({ROOM_ID})"},
        "reply": {"bash": "crew reply {{room}} <<'EOF'\nRead the news too. Your turn.\nEOF"},
    },
    # Every turn, whoever wrote: answer in the room.
    {
        "role": "user",
        "match": rf"Reply with: crew reply (?P<room>{ROOM_ID})",
        "reply": {"bash": "crew reply {{room}} <<'EOF'\nGood point. Your turn.\nEOF"},
    },
]


def room_rows(db: Path | str, room_id: str) -> list[dict[str, Any]]:
    """The room's messages as the server stored them (read-only, beside the running server)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as raw:
        raw.row_factory = sqlite3.Row
        rows = raw.execute(
            "SELECT seq, author_kind, kind, body FROM messages WHERE room_id = ? ORDER BY seq",
            (room_id,),
        ).fetchall()
    return [dict(r) for r in rows]


def settle(chain: Chain, agents: list[dict[str, Any]]) -> None:
    """Both agents idle, nothing pending, no turn running — twice round, since one agent's
    last reply may have woken the other."""
    for agent in [*agents, *agents]:
        chain.settled_turns(agent["id"], timeout=120)


def test_two_agents_answering_each_other_stop_at_the_hop_limit(chain: Chain) -> None:
    chain.script(ALWAYS_ANSWER)
    agents = [chain.agent(f"loop{chain.engine_mode[0]}{n}") for n in range(AGENTS)]
    room = chain.group("the pair", [a["id"] for a in agents])
    db = chain.server.db

    for round_no in (1, 2):
        before = len(room_rows(db, room["id"]))
        chain.post(room["id"], "You two, talk it over." if round_no == 1 else "Go on, both.")
        wait_until(
            "the room to be paused",
            lambda: chain.expect_ok(chain.http.get(f"/api/rooms/{room['id']}"))["agents_paused"],
            120,
        )
        settle(chain, agents)
        rows = room_rows(db, room["id"])[before:]
        said = [r for r in rows if r["author_kind"] == "agent"]
        pauses = [r for r in rows if r["kind"] == "notice" and r["body"].startswith(PAUSED)]
        # Exactly one notice, right after the first agent message beyond the limit: the
        # hop limit's messages woke the other agent, that one woke nobody.
        assert len(pauses) == 1, rows
        assert pauses[0]["body"] == (
            f"{PAUSED} ({HOPS + 1} agent messages in a row; this room's hop limit is {HOPS})"
        )
        assert said[HOPS]["seq"] + 1 == pauses[0]["seq"], rows
        # Each waking message is answered once at most: a turn already woken may still
        # post after the notice, nothing more (before: 116 messages in 30 s).
        assert HOPS + 1 <= len(said) <= HOPS + AGENTS, rows
        shown = chain.expect_ok(chain.http.get(f"/api/rooms/{room['id']}"))
        assert shown["agents_paused"]["reason"] == "hops"
        assert shown["agents_paused"]["seq"] == said[HOPS]["seq"]
    # Nothing was set aside: every turn succeeded.
    for agent in agents:
        assert {t["status"] for t in chain.turns(agent["id"])} == {"succeeded"}
