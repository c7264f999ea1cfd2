"""Mutes: an agent silencing a group's wake-ups for a while."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from crew_server import rules
from crew_server.clock import iso
from crew_server.errors import NotFound, Refused
from crew_server.store.db import StorePart
from crew_server.store.identities import AgentIdentity
from crew_server.store.rooms import require_member, room_row


class Mutes(StorePart):
    """Muting and unmuting groups (who a message wakes reads the mutes in `messages`)."""

    def mute(self, agent: AgentIdentity, room_id: str, until: datetime | None) -> dict[str, Any]:
        """Mute a group for an agent until `until` (15 minutes – 7 days ahead) or until unmuted."""
        with self._database.write() as tx:
            require_member(tx, room_id, agent.agent_id)
            kind = room_row(tx, room_id)["kind"]
            if kind != "group":
                raise Refused(
                    f"only groups can be muted; a {kind} always wakes you (you can leave it unanswered)"
                )
            try:
                rules.check_mute_until(until, self.clock.now())
            except ValueError as exc:
                raise Refused(str(exc)) from exc
            until_text = iso(until) if until is not None else None
            tx.execute(
                "INSERT INTO mutes VALUES (?, ?, ?) "
                "ON CONFLICT (agent_id, room_id) DO UPDATE SET until = excluded.until",
                (agent.agent_id, room_id, until_text),
            )
        return {"room_id": room_id, "until": until_text}

    def mute_for_agent(self, agent_id: str, room_id: str) -> None:
        """The user mutes an agent in a group until unmuted (the agent's own `mute` rules:
        groups only, members only)."""
        with self._database.write() as tx:
            if (
                tx.execute(
                    "SELECT 1 FROM agents WHERE id = ? AND deleted_at IS NULL", (agent_id,)
                ).fetchone()
                is None
            ):
                raise NotFound(f"no agent {agent_id}")
            require_member(tx, room_id, agent_id)
            kind = room_row(tx, room_id)["kind"]
            if kind != "group":
                raise Refused(f"only groups can be muted; a {kind} always wakes its agent")
            tx.execute(
                "INSERT INTO mutes VALUES (?, ?, NULL) "
                "ON CONFLICT (agent_id, room_id) DO UPDATE SET until = excluded.until",
                (agent_id, room_id),
            )

    def muted_in(self, room_id: str) -> dict[str, str | None]:
        """The agents muted in a room now: agent id → until (None: until unmuted)."""
        with self._database.read() as tx:
            rows = tx.execute(
                "SELECT agent_id, until FROM mutes WHERE room_id = ? "
                "AND (until IS NULL OR until > ?)",
                (room_id, tx.now()),
            ).fetchall()
        return {r["agent_id"]: r["until"] for r in rows}

    def unmute(self, agent_id: str, room_id: str) -> None:
        """Lift a mute. Wakes nobody: what arrived meanwhile waits for the next wake-up."""
        with self._database.write() as tx:
            if (
                tx.execute(
                    "SELECT 1 FROM agents WHERE id = ? AND deleted_at IS NULL", (agent_id,)
                ).fetchone()
                is None
            ):
                raise NotFound(f"no agent {agent_id}")
            room_row(tx, room_id)
            tx.execute("DELETE FROM mutes WHERE agent_id = ? AND room_id = ?", (agent_id, room_id))
