"""How an approval (issue 24; `store.approvals`) reads, and how a pending one ends when
its turn stops running.

Apart from `approvals` so that the message views (which carry a card's approval) and
the places turns end (`identities.connect`, `turns.finish_turn`,
`answered.sweep_running_turns`) can use it without importing how cards are posted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from crew_server.clock import parse_iso
from crew_server.store.db import Transaction

APPROVAL_COLS = (
    "id, turn_id, agent_id, computer_id, room_id, message_id, tool, patterns, always, summary, "
    "state, decision, reason, decided_by, created_at, expires_at, decided_at"
)
FIELDS = [name.strip() for name in APPROVAL_COLS.split(",")]
TURN_ENDED = "the turn ended"
RECONNECTED = "the turn ended (its Computer connected again)"


def approval_of(row: Mapping[str, Any], now: str | None = None) -> dict[str, Any]:
    """An approvals row (`APPROVAL_COLS`) as the APIs show it. With `now` (stored time), a
    pending one past its `expires_at` shows as expired (the sweep stores that soon)."""
    approval = {name: row[name] for name in FIELDS if name != "computer_id"}
    approval["patterns"] = orjson.loads(row["patterns"])
    approval["always"] = orjson.loads(row["always"])
    if now is not None and approval["state"] == "pending" and row["expires_at"] <= now:
        approval |= {
            "state": "expired",
            "reason": timeout_reason(row["created_at"], row["expires_at"]),
            "decided_at": row["expires_at"],
        }
    return approval


def timeout_reason(created_at: str, expires_at: str) -> str:
    """Why an approval nobody answered was refused: "no answer within 600 s"."""
    seconds = round((parse_iso(expires_at) - parse_iso(created_at)).total_seconds())
    return f"no answer within {seconds} s"


def nudge(tx: Transaction, computer_ids: set[str]) -> None:
    """Wake the Computers' listeners after the commit, without an SSE event: a long poll
    for an approval of theirs looks again (other processes hear it by NOTIFY)."""
    tx.touched.update(computer_ids)


def close_turn_approvals(tx: Transaction, turn_ids: list[str], reason: str = TURN_ENDED) -> None:
    """The pending approvals of turns that stopped running end `expired`, with `reason`."""
    if not turn_ids:
        return
    marks = ",".join("?" * len(turn_ids))
    closed = tx.execute(
        f"UPDATE approvals SET state = 'expired', reason = ?, decided_at = ? "
        f"WHERE state = 'pending' AND turn_id IN ({marks}) RETURNING computer_id",
        (reason, tx.now(), *turn_ids),
    ).fetchall()
    nudge(tx, {str(r["computer_id"]) for r in closed})
