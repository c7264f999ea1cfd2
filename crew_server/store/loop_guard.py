"""The loop guard (issue 24): agents answering each other without end are paused.

Per room, the store counts agent messages since the user last wrote (`rooms.agent_run`).
An agent message wakes other agents only while that count is below the room's hop limit
and the room's agent messages of the past minute are below its cap (`rules.loop_pause`).
The first message beyond a limit that would have woken someone pauses the room: it gets
one notice, and from that message on (`rooms.agents_paused_seq`) claims hold the room's
messages back, so an agent woken elsewhere cannot answer them and carry the loop on.
Nothing is lost: the messages are stored and stay unread. The user writing in the room
(a message, or a task action there) ends the pause; the agents it wakes get the backlog.

Who counts: a message of an agent and a notice of an agent's action (a task handed to
another agent) are agent messages; the user's message or action resets the run; other
notices (a reminder, a set-aside notice) are neither. A reminder still wakes its agent in
a paused room, and its claim goes up to the reminder (`positions.loop_release_seq`).

A thread is a room of its own here (its own run and pause) under its group's limits. A dm
never pauses: an agent's message there concerns nobody else. Every statement runs in the
posting transaction after `rooms.last_seq` was bumped, so posts to one room are in
order on both backends (PostgreSQL: the row's write conflict serializes them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crew_server import rules
from crew_server.clock import iso, parse_iso
from crew_server.errors import Invalid, NotFound
from crew_server.store.db import StorePart, Transaction

# A claim's upper end in a room that is not paused.
NO_CUT = 2**53


def _limits_room(tx: Transaction, room_id: str) -> Any:
    """The room's guard row with its limits (a thread's: its group's)."""
    row = tx.execute(
        "SELECT r.id, r.kind, r.agent_run, r.agents_paused_seq, r.agents_paused_at, "
        "r.agents_paused_reason, COALESCE(g.agent_hop_limit, r.agent_hop_limit) AS hop_limit, "
        "COALESCE(g.agent_rate_limit, r.agent_rate_limit) AS rate_limit "
        "FROM rooms r LEFT JOIN rooms g ON g.id = r.parent_room_id WHERE r.id = ?",
        (room_id,),
    ).fetchone()
    if row is None:
        raise NotFound(f"no room {room_id}")
    return row


def loop_facts(tx: Transaction, room_id: str, seq: int) -> rules.LoopFacts:
    """The guard's view of the room as the message at `seq` arrives."""
    row = _limits_room(tx, room_id)
    since = iso(parse_iso(tx.now()) - rules.RATE_WINDOW)
    # The cap'th newest agent message before this one: the cap is reached when it is
    # younger than a minute (reads at most `rate_limit` index entries).
    recent = tx.execute(
        "SELECT COUNT(*) AS n FROM (SELECT created_at FROM messages "
        "WHERE room_id = ? AND author_kind = 'agent' AND seq < ? ORDER BY seq DESC LIMIT ?) "
        "AS newest WHERE created_at > ?",
        (room_id, seq, row["rate_limit"], since),
    ).fetchone()["n"]
    return rules.LoopFacts(
        hop_limit=int(row["hop_limit"]),
        rate_limit=int(row["rate_limit"]),
        in_a_row=int(row["agent_run"]),
        last_minute=int(recent),
        paused=row["agents_paused_seq"] is not None,
    )


def user_wrote(tx: Transaction, room_id: str) -> None:
    """The user wrote (or acted) in the room: the run starts again, a pause ends."""
    tx.execute(
        "UPDATE rooms SET agent_run = 0, agents_paused_seq = NULL, agents_paused_at = NULL, "
        "agents_paused_reason = NULL WHERE id = ? AND (agent_run != 0 OR agents_paused_seq "
        "IS NOT NULL)",
        (room_id,),
    )


def agent_wrote(tx: Transaction, room_id: str, seq: int, pause: str | None) -> None:
    """Count an agent message; with `pause`, the room is paused from `seq` on."""
    if pause is None:
        tx.execute("UPDATE rooms SET agent_run = agent_run + 1 WHERE id = ?", (room_id,))
        return
    tx.execute(
        "UPDATE rooms SET agent_run = agent_run + 1, agents_paused_seq = ?, "
        "agents_paused_at = ?, agents_paused_reason = ? WHERE id = ?",
        (seq, tx.now(), pause, room_id),
    )


def release_to(tx: Transaction, room_id: str, seq: int, agent_ids: Sequence[str]) -> None:
    """A notice that woke these agents in a paused room: their claims reach it."""
    if not agent_ids:
        return
    if _limits_room(tx, room_id)["agents_paused_seq"] is None:
        return
    tx.executemany(
        "UPDATE positions SET loop_release_seq = ? WHERE agent_id = ? AND room_id = ?",
        [(seq, a, room_id) for a in agent_ids],
    )


def claim_cut(tx: Transaction, agent_id: str, room_id: str) -> int:
    """The last seq of the room a claim may hand the agent: everything (`NO_CUT`) unless
    the room is paused, then what came before the pause (or up to a notice that woke it)."""
    row = tx.execute(
        "SELECT r.agents_paused_seq, p.loop_release_seq FROM rooms r LEFT JOIN positions p "
        "ON p.room_id = r.id AND p.agent_id = ? WHERE r.id = ?",
        (agent_id, room_id),
    ).fetchone()
    if row is None or row["agents_paused_seq"] is None:
        return NO_CUT
    return max(int(row["agents_paused_seq"]) - 1, int(row["loop_release_seq"] or 0))


def guard_view(tx: Transaction, room_id: str) -> dict[str, Any]:
    """The room's loop guard as the API shows it (`Room` fields)."""
    row = _limits_room(tx, room_id)
    paused = None
    if row["agents_paused_seq"] is not None:
        paused = {
            "since": row["agents_paused_at"],
            "seq": row["agents_paused_seq"],
            "reason": row["agents_paused_reason"],
        }
    return {
        "agent_hop_limit": row["hop_limit"],
        "agent_rate_limit": row["rate_limit"],
        "agent_messages_in_a_row": row["agent_run"],
        "agents_paused": paused,
    }


class LoopGuard(StorePart):
    """The user's settings of a room's loop guard, and the pauses now on."""

    def set_loop_limits(self, room_id: str, hop_limit: int | None, rate_limit: int | None) -> None:
        """Change a dm's or group's limits (None: unchanged); a thread follows its group.

        A pause on stays on (the user's next message ends it); the new limits count the
        run so far.
        """
        with self._database.write() as tx:
            row = _limits_room(tx, room_id)
            if row["kind"] == "thread":
                parent = tx.execute(
                    "SELECT parent_room_id FROM rooms WHERE id = ?", (room_id,)
                ).fetchone()["parent_room_id"]
                raise Invalid(
                    "a thread follows its group's loop guard; change the group's "
                    f"(PATCH /api/rooms/{parent})"
                )
            if hop_limit is not None:
                tx.execute(
                    "UPDATE rooms SET agent_hop_limit = ? WHERE id = ?", (hop_limit, room_id)
                )
            if rate_limit is not None:
                tx.execute(
                    "UPDATE rooms SET agent_rate_limit = ? WHERE id = ?", (rate_limit, room_id)
                )
