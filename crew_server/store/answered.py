"""The server acknowledging, for a turn that ended without its ack, the rooms the turn
answered (issue 22): a failed or interrupted turn (its Computer gone, its end lost), or a
reply that lands after its turn ended (a paused server), so the next turn does not answer
the same messages again.

What a turn answered is what its own writes posted: each agent message records its turn
(`messages.turn_id`, bound by the turn identity `crew` sends: `store.turn_binding`), so a
reply counts for the turn that sent it however late it lands.
"""

from __future__ import annotations

from typing import Any

import orjson

from crew_server.store.approval_state import close_turn_approvals
from crew_server.store.db import Transaction

# A turn that ended so but had answered a room: its claim there is read (issue 22). A
# stopped turn (`cancelled`: the person's Stop, the Computer shutting down) too: what it
# already answered is not asked again; the rooms it did not answer stay unread.
ENDED_UNACKED = ("failed", "interrupted", "cancelled")


def answered_room(tx: Transaction, agent_id: str, turn_id: str, room_id: str) -> bool:
    """Whether the turn posted in the room (or a thread of it)."""
    return (
        tx.execute(
            "SELECT 1 FROM messages m JOIN rooms r ON r.id = m.room_id "
            "WHERE m.turn_id = ? AND m.author_kind = 'agent' AND m.author_id = ? "
            "AND (m.room_id = ? OR r.parent_room_id = ?) LIMIT 1",
            (turn_id, agent_id, room_id, room_id),
        ).fetchone()
        is not None
    )


def answered_every_room(tx: Transaction, agent_id: str, turn_id: str) -> bool:
    """Whether the turn posted in each room of its claim (or a thread of it)."""
    rooms = [r["room_id"] for r in _claim(tx, turn_id)]
    return bool(rooms) and all(answered_room(tx, agent_id, turn_id, r) for r in rooms)


def ack_answered_rooms(tx: Transaction, agent_id: str, turn_id: str) -> None:
    """Mark read, in each room of the turn it posted in (or a thread of it), that room's
    claim of the turn, and what a HELD answer showed the turn before it posted there.

    A failed or interrupted turn (its Computer killed, its reply timed out but landed)
    still answered those rooms: the next turn must not see them again. Rooms it did not
    answer stay unread, as before.
    """
    for room in _claim(tx, turn_id):
        room_id, upto = room["room_id"], int(room["to_seq"])
        if not answered_room(tx, agent_id, turn_id, room_id):
            continue
        # The agent's own messages right after the range (its answer) are read too.
        other = tx.execute(
            "SELECT MIN(seq) AS next FROM messages WHERE room_id = ? AND seq > ? "
            "AND NOT (author_kind = 'agent' AND author_id = ?)",
            (room_id, upto, agent_id),
        ).fetchone()["next"]
        if other is not None:
            read = int(other) - 1
        else:
            newest = tx.execute(
                "SELECT MAX(seq) AS newest FROM messages WHERE room_id = ?", (room_id,)
            ).fetchone()["newest"]
            read = max(int(newest or 0), upto)
        # A post is taken only once the agent was shown every message before it (HELD
        # shows them, moving `delivered_seq`): up to its last post here, it saw them all.
        # The cap at `delivered_seq` below keeps what a twice-held post never showed.
        last_post = tx.execute(
            "SELECT MAX(seq) AS last FROM messages WHERE room_id = ? AND turn_id = ? "
            "AND author_kind = 'agent' AND author_id = ?",
            (room_id, turn_id, agent_id),
        ).fetchone()["last"]
        read = max(read, int(last_post or 0))
        tx.execute(
            "UPDATE positions SET read_seq = CASE WHEN delivered_seq < ? THEN delivered_seq "
            "ELSE ? END WHERE agent_id = ? AND room_id = ? AND read_seq < ? AND delivered_seq >= ?",
            (read, read, agent_id, room_id, upto, upto),
        )


def ack_if_late(tx: Transaction, agent_id: str, turn_id: str | None) -> None:
    """After an agent's reply bound to `turn_id`: when that turn already ended failed or
    interrupted or was stopped, the reply acknowledges the rooms the turn answered."""
    if turn_id is None:
        return
    turn = tx.execute("SELECT status FROM turns WHERE id = ?", (turn_id,)).fetchone()
    if turn is not None and turn["status"] in ENDED_UNACKED:
        ack_answered_rooms(tx, agent_id, turn_id)


def sweep_running_turns(tx: Transaction, agent_id: str) -> None:
    """Turns of the agent still `running` when its next claim comes lost their end (the
    finish never arrived): they are interrupted, acknowledging what they answered first —
    before the claim hands those messages out again."""
    lost = tx.execute(
        "UPDATE turns SET status = 'interrupted', finished_at = ? "
        "WHERE agent_id = ? AND status = 'running' RETURNING id",
        (tx.now(), agent_id),
    ).fetchall()
    for turn in lost:
        ack_answered_rooms(tx, agent_id, str(turn["id"]))
    close_turn_approvals(tx, [str(turn["id"]) for turn in lost])


def _claim(tx: Transaction, turn_id: str) -> list[dict[str, Any]]:
    row = tx.execute("SELECT rooms FROM turns WHERE id = ?", (turn_id,)).fetchone()
    rooms: list[dict[str, Any]] = orjson.loads(row["rooms"])
    return rooms
