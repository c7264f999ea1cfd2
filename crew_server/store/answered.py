"""The server acknowledging, for a turn that ended without its ack, the rooms the turn
answered (issue 22): a failed or interrupted turn, or a reply that lands after its turn
ended (a paused server), so the next turn does not answer the same messages again."""

from __future__ import annotations

import orjson

from crew_server.store.db import Transaction

# A turn that ended so but had answered a room: its claim there is read (issue 22).
ENDED_UNACKED = ("failed", "interrupted")


def ack_answered_rooms(tx: Transaction, agent_id: str, turn_id: str) -> None:
    """Mark read, in each room of the turn the agent posted in (or a thread of it) since
    the turn was registered, that room's claim of the turn — only its range.

    A failed or interrupted turn (its Computer killed, its reply timed out but landed)
    still answered those rooms: the next turn must not see them again. Rooms it did not
    answer stay unread, as before.
    """
    turn = tx.execute("SELECT rooms, started_at FROM turns WHERE id = ?", (turn_id,)).fetchone()
    for room in orjson.loads(turn["rooms"]):
        room_id, upto = room["room_id"], int(room["to_seq"])
        answered = tx.execute(
            "SELECT 1 FROM messages m JOIN rooms r ON r.id = m.room_id "
            "WHERE m.author_kind = 'agent' AND m.author_id = ? AND m.created_at >= ? "
            "AND (m.room_id = ? OR r.parent_room_id = ?) LIMIT 1",
            (agent_id, turn["started_at"], room_id, room_id),
        ).fetchone()
        if answered is None:
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
        tx.execute(
            "UPDATE positions SET read_seq = CASE WHEN delivered_seq < ? THEN delivered_seq "
            "ELSE ? END WHERE agent_id = ? AND room_id = ? AND read_seq < ? AND delivered_seq >= ?",
            (read, read, agent_id, room_id, upto, upto),
        )


def ack_if_late(tx: Transaction, agent_id: str) -> None:
    """After an agent's reply: when its latest turn already ended failed or interrupted,
    the reply belongs to that turn and acknowledges the rooms it answered."""
    turn = tx.execute(
        "SELECT id, status FROM turns WHERE agent_id = ? ORDER BY started_at DESC LIMIT 1",
        (agent_id,),
    ).fetchone()
    if turn is not None and turn["status"] in ENDED_UNACKED:
        ack_answered_rooms(tx, agent_id, str(turn["id"]))
