"""Idempotent agent writes: the `Idempotency-Key` a `crew` write carries, kept per agent
and turn (the turn the write is bound to: `store.turn_binding`), so a retried or late
request is done once and gets the first answer. Each row also links that write to its turn.

The key's row is inserted inside the write's own transaction (`claim_pending`, called by
both backends just before COMMIT), so "done" and "key taken" commit together: a request
that crashes before its commit leaves no key, one that crashed after it leaves a key
without an answer (`status` NULL), which a retry reads as "already done".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from crew_server.clock import iso
from crew_server.store.db import PENDING, DuplicateWrite, PendingWrite, StorePart
from crew_server.store.turn_binding import refuse_if_superseded

__all__ = ["PENDING", "DuplicateWrite", "EarlierWrite", "PendingWrite"]

# A key is sent again only within its turn (the agent running the same command again,
# `crew`'s retries within 10 s) or late from a paused server's backlog: 48 h is far past
# the longest turn (hours) and the reporter's wait, and keeps one row per agent write.
KEEP = timedelta(hours=48)


@dataclass(frozen=True)
class EarlierWrite:
    """A write already done under the same key: its fingerprint and (maybe) answer."""

    fingerprint: str
    status: int | None
    answer: str | None


class AgentWrites(StorePart):
    """The kept keys of agent writes."""

    def refuse_late_write(self, turn_id: str | None) -> None:
        """`TurnOver` when the write's turn is over and a newer turn has its messages."""
        with self._database.read() as tx:
            refuse_if_superseded(tx, turn_id)

    def earlier_write(self, agent_id: str, turn_id: str, key: str) -> EarlierWrite | None:
        """The write already done under this key, if any (and not expired)."""
        cutoff = iso(self.clock.now() - KEEP)
        with self._database.read() as tx:
            row = tx.execute(
                "SELECT fingerprint, status, answer FROM agent_writes "
                "WHERE agent_id = ? AND turn_id = ? AND key = ? AND created_at >= ?",
                (agent_id, turn_id, key, cutoff),
            ).fetchone()
        if row is None:
            return None
        return EarlierWrite(row["fingerprint"], row["status"], row["answer"])

    def keep_write_answer(
        self, agent_id: str, turn_id: str, key: str, status: int, answer: str
    ) -> None:
        """Store the first answer of a done write; drop keys past KEEP."""
        cutoff = iso(self.clock.now() - KEEP)
        with self._database.write() as tx:
            tx.execute(
                "UPDATE agent_writes SET status = ?, answer = ? "
                "WHERE agent_id = ? AND turn_id = ? AND key = ?",
                (status, answer, agent_id, turn_id, key),
            )
            tx.execute("DELETE FROM agent_writes WHERE created_at < ?", (cutoff,))
