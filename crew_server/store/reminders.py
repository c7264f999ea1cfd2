"""Reminders: an agent's scheduled notices in a room, fired by the scheduler."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any

from crew_server import rules
from crew_server.clock import iso, parse_iso
from crew_server.errors import NotFound
from crew_server.store.db import StorePart, new_id
from crew_server.store.identities import AgentIdentity
from crew_server.store.messages import post
from crew_server.store.rooms import require_member

REMINDER_COLS = "id, agent_id, room_id, title, next_at, every, daily, weekly_day, weekly_time, tz"


def reminder_of(r: sqlite3.Row) -> dict[str, Any]:
    """A reminder row (`REMINDER_COLS`) as the API shows it."""
    return {
        "id": r["id"],
        "agent_id": r["agent_id"],
        "room_id": r["room_id"],
        "title": r["title"],
        "next_at": r["next_at"],
        "every": r["every"],
        "daily": r["daily"],
        "weekly": (
            {"day": r["weekly_day"], "time": r["weekly_time"]}
            if r["weekly_day"] is not None
            else None
        ),
        "tz": r["tz"],
    }


def schedule_of(r: sqlite3.Row) -> rules.Schedule:
    """The schedule a reminder row was created with (one-off: at its `next_at`)."""
    repeats = r["every"] or r["daily"] or r["weekly_day"]
    return rules.Schedule(
        at=None if repeats else parse_iso(r["next_at"]),
        every=r["every"],
        daily=r["daily"],
        weekly_day=r["weekly_day"],
        weekly_time=r["weekly_time"],
        tz=r["tz"],
    )


class Reminders(StorePart):
    """Creating, listing, cancelling and firing reminders."""

    def create_reminder(
        self, agent: AgentIdentity, room_id: str, title: str, schedule: rules.Schedule
    ) -> dict[str, Any]:
        """A reminder of an agent in a room it belongs to."""
        reminder_id = new_id()
        with self._database.write() as tx:
            require_member(tx, room_id, agent.agent_id)
            next_at = rules.first_fire(schedule, self.clock.now())
            tx.execute(
                f"INSERT INTO reminders ({REMINDER_COLS}, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    reminder_id,
                    agent.agent_id,
                    room_id,
                    title,
                    iso(next_at),
                    schedule.every,
                    schedule.daily,
                    schedule.weekly_day,
                    schedule.weekly_time,
                    schedule.tz,
                    tx.now(),
                ),
            )
            row = tx.execute(
                f"SELECT {REMINDER_COLS} FROM reminders WHERE id = ?", (reminder_id,)
            ).fetchone()
        return reminder_of(row)

    def list_reminders(self, agent_id: str) -> list[dict[str, Any]]:
        """An agent's reminders, soonest first."""
        with self._database.read() as tx:
            rows = tx.execute(
                f"SELECT {REMINDER_COLS} FROM reminders WHERE agent_id = ? ORDER BY next_at, id",
                (agent_id,),
            ).fetchall()
        return [reminder_of(r) for r in rows]

    def delete_reminder(self, agent_id: str, reminder_id: str) -> None:
        """Cancel one of the agent's reminders."""
        with self._database.write() as tx:
            gone = tx.execute(
                "DELETE FROM reminders WHERE id = ? AND agent_id = ?", (reminder_id, agent_id)
            ).rowcount
        if not gone:
            raise NotFound(f"no reminder {reminder_id} of yours; list them with crew remind list")

    def next_reminder_at(self) -> datetime | None:
        """When the next reminder is due, or None."""
        with self._database.read() as tx:
            row = tx.execute("SELECT MIN(next_at) AS next_at FROM reminders").fetchone()
        return parse_iso(row["next_at"]) if row and row["next_at"] else None

    def fire_due_reminders(self) -> int:
        """Post the notice of every due reminder, wake its agent, reschedule or drop it."""
        now = self.clock.now()
        fired = 0
        qualified = ", ".join(f"r.{c.strip()}" for c in REMINDER_COLS.split(","))
        with self._database.write() as tx:
            # Several server processes: one fires at a time (the others find nothing due).
            tx.serialize("reminders")
            due = tx.execute(
                f"SELECT {qualified}, a.handle FROM reminders r "
                "JOIN agents a ON a.id = r.agent_id WHERE r.next_at <= ? ORDER BY r.next_at, r.id",
                (iso(now),),
            ).fetchall()
            for r in due:
                reminder = reminder_of(r)
                post(
                    tx,
                    reminder["room_id"],
                    None,
                    rules.reminder_notice(r["handle"], reminder["title"]),
                    notice_wakes=[reminder["agent_id"]],
                )
                following = rules.next_fire(schedule_of(r), parse_iso(r["next_at"]), now)
                if following is None:
                    tx.execute("DELETE FROM reminders WHERE id = ?", (r["id"],))
                else:
                    tx.execute(
                        "UPDATE reminders SET next_at = ? WHERE id = ?", (iso(following), r["id"])
                    )
                fired += 1
        return fired
