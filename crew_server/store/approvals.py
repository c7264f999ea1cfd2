"""Approvals (issue 24): a running turn's tool call that its agent's policy says to `ask`
about, put to the person as a card in the room, and the person's answer.

The Computer creates one (`create_approval`, once per turn and engine request id) and
waits for it (`get_approval`, long-polled by the API); the user answers it
(`answer_approval`). It is fenced to the turn that asked: only a running turn of the
Computer's current connection may ask, and an answer is taken only while that turn
runs. A pending approval ends `expired` when nobody answers by `expires_at` (on read,
and by the scheduler's sweep: `expire_due_approvals`), when its turn ends
(`close_turn_approvals`, called where a turn stops running) or when its Computer
connects again (its turns are interrupted). A mere reconnect of the Computer's event
stream changes nothing: the approval is stored, so it survives a server restart too.

The card is a system message that wakes nobody; the message views carry the approval
(`message_view.py`). Each change of an approval notifies its Computer's listeners
without an SSE event (`nudge`), so a long poll waiting for it, in this server process
or (PostgreSQL's NOTIFY) another, looks again at once.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import orjson

from crew_common.permissions import PermissionPolicy
from crew_server.clock import iso, parse_iso
from crew_server.errors import ApprovalClosed, Conflict, NotFound
from crew_server.store.approval_state import (
    APPROVAL_COLS,
    approval_of,
    close_turn_approvals,
    nudge,
    timeout_reason,
)
from crew_server.store.db import StorePart, Transaction, new_id
from crew_server.store.identities import Actor, stored_permission
from crew_server.store.messages import post
from crew_server.store.turn_binding import TurnOver

DENIED_BY_USER = "denied by the user"
# What the card says an agent wants, by tool (OpenCode's permission names).
_VERBS = {
    "bash": "run",
    "edit": "edit",
    "read": "read",
    "external_directory": "work outside its folder on",
    "webfetch": "fetch",
    "websearch": "search the web for",
    "codesearch": "search code for",
    "task": "start a subagent for",
}


def card_text(handle: str, tool: str, summary: str) -> str:
    """The card's text: "@ada wants to run `git push origin main`" (pure)."""
    subject = " ".join(summary.split())[:500] or "*"
    fence = "``" if "`" in subject else "`"
    verb = _VERBS.get(tool, f"use {tool} on")
    return f"@{handle} wants to {verb} {fence}{subject}{fence}"


def expire_due(tx: Transaction, where: str = "", params: tuple[Any, ...] = ()) -> int:
    """Pending approvals past `expires_at` (of those `where` narrows to) end `expired`."""
    now = tx.now()
    due = tx.execute(
        f"SELECT id, computer_id, created_at, expires_at FROM approvals "
        f"WHERE state = 'pending' AND expires_at <= ? {where}",
        (now, *params),
    ).fetchall()
    for row in due:
        tx.execute(
            "UPDATE approvals SET state = 'expired', reason = ?, decided_at = ? "
            "WHERE id = ? AND state = 'pending'",
            (timeout_reason(row["created_at"], row["expires_at"]), now, row["id"]),
        )
    nudge(tx, {str(r["computer_id"]) for r in due})
    return len(due)


def asking_room(tx: Transaction, turn: Any) -> str:
    """Where a turn's card goes: the room of the newest message the turn claimed; for a
    turn that claimed none, its agent's direct conversation."""
    newest: tuple[str, str] | None = None
    for room in orjson.loads(turn["rooms"]):
        row = tx.execute(
            "SELECT created_at FROM messages WHERE room_id = ? AND seq = ?",
            (room["room_id"], int(room["to_seq"])),
        ).fetchone()
        if row is not None and (newest is None or row["created_at"] >= newest[0]):
            newest = (row["created_at"], room["room_id"])
    if newest is not None:
        return newest[1]
    dm = tx.execute(
        "SELECT r.id FROM rooms r JOIN room_members m ON m.room_id = r.id "
        "WHERE r.kind = 'dm' AND m.agent_id = ? ORDER BY r.created_at LIMIT 1",
        (turn["agent_id"],),
    ).fetchone()
    if dm is None:
        raise Conflict(
            f"turn {turn['id']} claimed no message and its agent has no direct conversation: "
            "there is no room to ask in, so the call is refused"
        )
    return str(dm["id"])


class Approvals(StorePart):
    """Asking the person (the Computer), answering (the user), and reading approvals."""

    def create_approval(
        self,
        computer_id: str,
        turn_id: str,
        request_id: str,
        tool: str,
        patterns: list[str],
        always: list[str],
        summary: str,
    ) -> tuple[dict[str, Any], bool]:
        """A card for a running turn of this Computer → (approval, created). The same
        `request_id` for the same turn again gives the first approval (created False).

        `TurnOver` (409 `turn_over`) when the turn is not running, or was registered by an
        older connection of the Computer (the caller's connection is checked by the API).
        """
        with self._database.write() as tx:
            turn = tx.execute(
                "SELECT t.id, t.agent_id, t.computer_id, t.fence, t.status, t.rooms, c.epoch "
                "FROM turns t JOIN computers c ON c.id = t.computer_id WHERE t.id = ?",
                (turn_id,),
            ).fetchone()
            if turn is None or turn["computer_id"] != computer_id:
                raise NotFound(f"no turn {turn_id} on this computer")
            known = tx.execute(
                f"SELECT {APPROVAL_COLS} FROM approvals WHERE turn_id = ? AND request_id = ?",
                (turn_id, request_id),
            ).fetchone()
            if known is not None:
                return approval_of(known, iso(self.clock.now())), False
            if turn["status"] != "running":
                raise TurnOver(
                    f"turn {turn_id} is {turn['status']}, no longer running: nobody is asked "
                    "for it; refuse the call"
                )
            if turn["fence"] != turn["epoch"]:
                raise TurnOver(
                    f"turn {turn_id} belongs to an older connection of this computer: nobody "
                    "is asked for it; refuse the call"
                )
            agent = tx.execute(
                "SELECT handle, permission FROM agents WHERE id = ?", (turn["agent_id"],)
            ).fetchone()
            policy = PermissionPolicy.parse(orjson.loads(agent["permission"]))
            room_id = asking_room(tx, turn)
            asker = Actor("agent", turn["agent_id"], agent["handle"], turn_id)
            # A notice wakes nobody; `caused_by`: the asking agent has seen its own card,
            # so it does not hold the agent's next reply there.
            card = post(
                tx, room_id, None, card_text(agent["handle"], tool, summary), caused_by=asker
            )
            approval_id = new_id()
            now = self.clock.now()
            tx.execute(
                f"INSERT INTO approvals ({APPROVAL_COLS}, request_id) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL, NULL, NULL, ?, ?, NULL, ?)",
                (
                    approval_id,
                    turn_id,
                    turn["agent_id"],
                    computer_id,
                    room_id,
                    card["id"],
                    tool,
                    orjson.dumps(patterns).decode(),
                    orjson.dumps(always).decode(),
                    summary,
                    iso(now),
                    iso(now + timedelta(seconds=policy.ask_timeout_s)),
                    request_id,
                ),
            )
            row = tx.execute(
                f"SELECT {APPROVAL_COLS} FROM approvals WHERE id = ?", (approval_id,)
            ).fetchone()
            return approval_of(row), True

    def get_approval(self, approval_id: str, computer_id: str | None = None) -> dict[str, Any]:
        """One approval (of this Computer's agents when `computer_id` is given); a pending
        one past its `expires_at` is expired first."""
        with self._database.read() as tx:
            row = tx.execute(
                f"SELECT {APPROVAL_COLS} FROM approvals WHERE id = ?", (approval_id,)
            ).fetchone()
        if row is None or (computer_id is not None and row["computer_id"] != computer_id):
            raise NotFound(f"no approval {approval_id}")
        if row["state"] == "pending" and row["expires_at"] <= iso(self.clock.now()):
            with self._database.write() as tx:
                expire_due(tx, "AND id = ?", (approval_id,))
                row = tx.execute(
                    f"SELECT {APPROVAL_COLS} FROM approvals WHERE id = ?", (approval_id,)
                ).fetchone()
        return approval_of(row)

    def list_approvals(self, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Approvals newest first (in `state` when given)."""
        self.expire_due_approvals()
        with self._database.read() as tx:
            if state is None:
                rows = tx.execute(
                    f"SELECT {APPROVAL_COLS} FROM approvals "
                    "ORDER BY created_at DESC, id DESC LIMIT ?",
                    (limit,),
                ).fetchall()
            else:
                rows = tx.execute(
                    f"SELECT {APPROVAL_COLS} FROM approvals WHERE state = ? "
                    "ORDER BY created_at DESC, id DESC LIMIT ?",
                    (state, limit),
                ).fetchall()
        return [approval_of(r) for r in rows]

    def answer_approval(
        self, approval_id: str, decision: str, decided_by: str = "user"
    ) -> dict[str, Any]:
        """The person's answer: `once`, `always` (also an allow rule in the agent's policy,
        `PermissionPolicy.with_always`) or `deny`. `ApprovalClosed` (409) when it is no
        longer pending: answered, expired, or its turn is over."""
        self.get_approval(approval_id)  # expires it first when it is past its time
        with self._database.write() as tx:
            row = tx.execute(
                f"SELECT {APPROVAL_COLS} FROM approvals WHERE id = ?", (approval_id,)
            ).fetchone()
            if row is None:
                raise NotFound(f"no approval {approval_id}")
            if row["state"] != "pending":
                closed = "already answered" if row["decision"] else f"expired: {row['reason']}"
                raise ApprovalClosed(f"approval {approval_id} is {closed}; nothing was changed")
            turn = tx.execute(
                "SELECT t.status, t.fence, c.epoch FROM turns t "
                "JOIN computers c ON c.id = t.computer_id WHERE t.id = ?",
                (row["turn_id"],),
            ).fetchone()
            if turn["status"] != "running" or turn["fence"] != turn["epoch"]:
                close_turn_approvals(tx, [row["turn_id"]])
                ended = row["id"]
            else:
                ended = None
                state = "denied" if decision == "deny" else "allowed"
                tx.execute(
                    "UPDATE approvals SET state = ?, decision = ?, reason = ?, decided_by = ?, "
                    "decided_at = ? WHERE id = ?",
                    (
                        state,
                        decision,
                        DENIED_BY_USER if decision == "deny" else None,
                        decided_by,
                        tx.now(),
                        approval_id,
                    ),
                )
                if decision == "always":
                    self._allow_always(tx, row)
                nudge(tx, {str(row["computer_id"])})
        if ended is not None:
            # Committed above (the approval is expired now); the answer is refused.
            raise ApprovalClosed(
                f"approval {ended} is closed: its turn ended, so the answer was not taken"
            )
        return self.get_approval(approval_id)

    def _allow_always(self, tx: Transaction, row: Any) -> None:
        """ "Always": allow rules for what was asked, last in the agent's policy (visible and
        removable like any rule); its Computer hears `agents`."""
        agent = tx.execute(
            "SELECT permission, computer_id FROM agents WHERE id = ?", (row["agent_id"],)
        ).fetchone()
        policy = PermissionPolicy.parse(orjson.loads(agent["permission"]))
        patterns = orjson.loads(row["always"]) or orjson.loads(row["patterns"]) or ["*"]
        updated = policy.with_always(row["tool"], patterns)
        tx.execute(
            "UPDATE agents SET permission = ? WHERE id = ?",
            (stored_permission(updated.as_dict()), row["agent_id"]),
        )
        if agent["computer_id"] is not None:
            tx.emit(agent["computer_id"], "agents", {"agent_id": row["agent_id"]})

    def expire_due_approvals(self) -> int:
        """The sweep: pending approvals past `expires_at` end `expired`; how many did."""
        with self._database.read() as tx:
            due = tx.execute(
                "SELECT 1 FROM approvals WHERE state = 'pending' AND expires_at <= ? LIMIT 1",
                (tx.now(),),
            ).fetchone()
        if due is None:
            return 0
        with self._database.write() as tx:
            return expire_due(tx)

    def next_approval_expiry(self) -> datetime | None:
        """When the next pending approval expires (None: none pending)."""
        with self._database.read() as tx:
            row = tx.execute(
                "SELECT MIN(expires_at) AS next FROM approvals WHERE state = 'pending'"
            ).fetchone()
        return parse_iso(row["next"]) if row["next"] else None

    def room_approvals_changed(self, room_id: str, since: str) -> list[str]:
        """Message ids of the room's cards whose approval was decided at or after `since`."""
        with self._database.read() as tx:
            return [
                str(r["message_id"])
                for r in tx.execute(
                    "SELECT message_id FROM approvals WHERE room_id = ? AND decided_at >= ? "
                    "AND message_id IS NOT NULL ORDER BY decided_at",
                    (room_id, since),
                )
            ]
