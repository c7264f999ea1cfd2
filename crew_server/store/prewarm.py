"""Prewarm hints (issue 26): a person opened a room or began typing in it, so its agents'
Computers may start those agents' engines before the message comes.

A hint is `prewarm {"agent_ids": [...]}` in the Computer's event log, like `wake` and
`stop`; it never starts a turn (the Computer only warms). How often one is sent is
the caller's business (`crew_server.api.stream.PrewarmHints`).
"""

from __future__ import annotations

from crew_server.store.db import StorePart
from crew_server.store.rooms import member_room


class Prewarms(StorePart):
    """Who a room's prewarm hint goes to, and sending it."""

    def room_agents_on_computers(self, room_id: str) -> list[tuple[str, str]]:
        """(agent id, Computer id) of the room's agents that are on a Computer (a thread:
        its group's), by agent id; 404 for an unknown room."""
        with self._database.read() as tx:
            base = member_room(tx, room_id)
            rows = tx.execute(
                "SELECT a.id, a.computer_id FROM room_members rm "
                "JOIN agents a ON a.id = rm.agent_id "
                "WHERE rm.room_id = ? AND a.computer_id IS NOT NULL AND a.deleted_at IS NULL "
                "ORDER BY a.id",
                (base,),
            ).fetchall()
        return [(r["id"], r["computer_id"]) for r in rows]

    def send_prewarm(self, agents_by_computer: dict[str, list[str]]) -> None:
        """One `prewarm {"agent_ids": [...]}` to each Computer (none when the map is empty)."""
        events = [
            (computer_id, "prewarm", {"agent_ids": agent_ids})
            for computer_id, agent_ids in sorted(agents_by_computer.items())
            if agent_ids
        ]
        if not events:
            return
        with self._database.write() as tx:
            tx.emit_many(events)
