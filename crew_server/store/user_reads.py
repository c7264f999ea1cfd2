"""The user's read positions: how far the person has read each room, and what is unread."""

from __future__ import annotations

from crew_server.store.db import StorePart
from crew_server.store.rooms import room_row

# Unread counts stop here (shown as "100+"): counting stays cheap in a room of any length.
UNREAD_CAP = 100


class UserReads(StorePart):
    """Marking rooms read by the user and counting what the user has not read yet."""

    def mark_read_by_user(self, room_id: str, seq: int) -> None:
        """The user has seen the room up to `seq` (a position never moves back)."""
        with self._database.write() as tx:
            room_row(tx, room_id)
            tx.execute(
                "INSERT INTO user_reads (room_id, read_seq) VALUES (?, ?) ON CONFLICT (room_id) "
                "DO UPDATE SET read_seq = CASE WHEN user_reads.read_seq < excluded.read_seq "
                "THEN excluded.read_seq ELSE user_reads.read_seq END",
                (room_id, seq),
            )

    def unread_by_user(self) -> dict[str, int]:
        """Per dm and group: how many messages others wrote after the user's read position
        (at most `UNREAD_CAP`)."""
        with self._database.read() as tx:
            rows = tx.execute(
                "SELECT r.id, (SELECT COUNT(*) FROM (SELECT 1 FROM messages m "
                "  WHERE m.room_id = r.id AND m.seq > COALESCE(ur.read_seq, 0) "
                "  AND m.author_kind != 'user' LIMIT ?) AS capped) AS unread "
                "FROM rooms r LEFT JOIN user_reads ur ON ur.room_id = r.id "
                "WHERE r.kind != 'thread'",
                (UNREAD_CAP,),
            ).fetchall()
        return {r["id"]: int(r["unread"]) for r in rows}
