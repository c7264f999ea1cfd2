"""What the agents of a room are doing, for the line under its timeline (issue 25).

Two things live there: who is working on a turn for the room now (with the step the turn
is at, read from its newest events), and which agent's turns for the room failed since
its last success (one line per agent, however often the Computer retried). The person
can dismiss a failure line: it stays away until a turn fails after the one dismissed.

The live stream asks this of every open room every poll, so each question is a few
indexed look-ups: the room's members (`room_members`), their running turn
(`turns_running_by_agent`) and its last events (`turn_events`' key), or their recent
turns (`turns_by_agent`). A turn names its rooms in a JSON column; the rooms are picked
out here, in Python, from the few turns read.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from crew_server.errors import Invalid, NotFound
from crew_server.store.db import StorePart, Transaction
from crew_server.store.rooms import room_row

# How many recent events of a running turn are read to say what it is doing.
RECENT_EVENTS = 12
# How many recent ended turns of an agent are read to find its failures in a room: an
# agent that ended more turns than this elsewhere since failing here shows no line.
RECENT_TURNS = 50
# The characters of a tool's input or title the line shows.
DETAIL_CHARS = 80
# Only the person writes in the web app today; the table has room for more.
WEB_USER = "user"


def serves_room(rooms_json: str, room_id: str) -> bool:
    """Whether a turn (its `rooms` column) was given messages of `room_id`."""
    try:
        rooms = orjson.loads(rooms_json)
    except orjson.JSONDecodeError:
        return False
    return any(isinstance(r, dict) and r.get("room_id") == room_id for r in rooms)


def event_data(row: sqlite3.Row) -> dict[str, Any]:
    """An event's data as an object (a malformed row reads as empty: the line is a hint)."""
    try:
        data = orjson.loads(row["data"])
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def tool_detail(data: dict[str, Any]) -> str | None:
    """What a tool call is about in one short line: its title, else its command or the
    first text of its input."""
    raw = data.get("input")
    text: Any = data.get("title")
    if not text and isinstance(raw, dict):
        text = raw.get("command") or raw.get("description") or raw.get("filePath")
        text = text or next((v for v in raw.values() if isinstance(v, str) and v), None)
    elif not text and isinstance(raw, str):
        text = raw
    if not isinstance(text, str) or not text.strip():
        return None
    line = text.strip().splitlines()[0]
    return line if len(line) <= DETAIL_CHARS else line[: DETAIL_CHARS - 1] + "…"


def current_step(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What a running turn is doing, from its events newest first (`type`, `data`):
    `{"doing", "tool", "detail"}`, `doing` one of starting, running, thinking, writing,
    waiting (for the person's approval).

    A `tool_start` whose call has no `tool_use` among the newer events is a tool still
    running; an approval asked and not answered is a turn waiting for the person.
    """
    finished_calls: set[str] = set()
    answered = False
    for event in events:
        kind, data = event["type"], event["data"]
        if kind == "tool_use":
            finished_calls.add(str(data.get("call_id")))
        elif kind == "approval_answered":
            answered = True
        elif kind == "approval_asked" and not answered:
            return {"doing": "waiting", "tool": data.get("tool"), "detail": None}
        elif kind == "tool_start" and str(data.get("call_id")) not in finished_calls:
            return {"doing": "running", "tool": data.get("tool"), "detail": tool_detail(data)}
    newest = events[0]["type"] if events else None
    if newest == "text":
        return {"doing": "writing", "tool": None, "detail": None}
    if newest is None:
        return {"doing": "starting", "tool": None, "detail": None}
    return {"doing": "thinking", "tool": None, "detail": None}


def recent_events(tx: Transaction, turn_id: str) -> list[dict[str, Any]]:
    """The newest `RECENT_EVENTS` events of a turn, newest first (by its key)."""
    rows = tx.execute(
        "SELECT type, data FROM turn_events WHERE turn_id = ? ORDER BY idx DESC LIMIT ?",
        (turn_id, RECENT_EVENTS),
    ).fetchall()
    return [{"type": r["type"], "data": event_data(r)} for r in rows]


def working_in(tx: Transaction, room_id: str) -> list[dict[str, Any]]:
    """The room's members with a running turn for it, each with what the turn is doing."""
    rows = tx.execute(
        "SELECT t.id, t.agent_id, t.rooms, t.started_at, a.handle, a.name "
        "FROM room_members rm "
        "JOIN turns t ON t.agent_id = rm.agent_id AND t.status = 'running' "
        "JOIN agents a ON a.id = rm.agent_id "
        "WHERE rm.room_id = ? ORDER BY a.handle",
        (room_id,),
    ).fetchall()
    return [
        {
            "agent_id": r["agent_id"],
            "handle": r["handle"],
            "name": r["name"],
            "turn_id": r["id"],
            "started_at": r["started_at"],
            **current_step(recent_events(tx, r["id"])),
        }
        for r in rows
        if serves_room(r["rooms"], room_id)
    ]


def failures_since_success(tx: Transaction, agent_id: str, room_id: str) -> list[sqlite3.Row]:
    """The agent's failed turns for the room since its last success there, newest first.
    Cancelled and interrupted turns neither count nor clear (nobody's fault, no answer)."""
    rows = tx.execute(
        "SELECT id, status, failure, rooms, finished_at FROM turns "
        "WHERE agent_id = ? AND status != 'running' "
        "ORDER BY started_at DESC, rowid DESC LIMIT ?",
        (agent_id, RECENT_TURNS),
    )
    failed = []
    for row in rows:  # read as they come: most stop at the newest turn, a success
        if not serves_room(row["rooms"], room_id):
            continue
        if row["status"] == "succeeded":
            break
        if row["status"] == "failed":
            failed.append(row)
    return failed


def dismissed_turn(tx: Transaction, room_id: str, agent_id: str) -> str | None:
    row = tx.execute(
        "SELECT turn_id FROM room_status_dismissals "
        "WHERE user_id = ? AND room_id = ? AND agent_id = ?",
        (WEB_USER, room_id, agent_id),
    ).fetchone()
    return row["turn_id"] if row else None


def failure_line(tx: Transaction, room_id: str, agent: sqlite3.Row) -> dict[str, Any] | None:
    """An agent's failure line in the room: its newest failure and how many there were
    since its last success (after the one the person dismissed); None when there is none."""
    failed = failures_since_success(tx, agent["id"], room_id)
    dismissed = dismissed_turn(tx, room_id, agent["id"])
    ids = [r["id"] for r in failed]
    if dismissed in ids:
        failed = failed[: ids.index(dismissed)]
    if not failed:
        return None
    newest = failed[0]
    failure = orjson.loads(newest["failure"]) if newest["failure"] else {}
    return {
        "agent_id": agent["id"],
        "handle": agent["handle"],
        "name": agent["name"],
        "turn_id": newest["id"],
        "count": len(failed),
        "last_at": newest["finished_at"],
        "class": str(failure.get("class") or "failed"),
        "reason": str(failure.get("reason") or ""),
    }


class RoomActivity(StorePart):
    """The room's status line: who works on a turn for it now, whose turns failed there."""

    def room_activity(self, room_id: str) -> dict[str, list[dict[str, Any]]]:
        """`{"working": [...], "failures": [...]}` for the room, one entry per agent.

        A working entry: agent (`agent_id`, `handle`, `name`), `turn_id`, `started_at`,
        and `current_step`'s `doing`, `tool`, `detail`. A failure entry: agent, the newest
        failed `turn_id`, `count` (failures since the last success), `last_at`, the
        failure's `class` and `reason`. An agent working again keeps its failure line
        until a turn succeeds.
        """
        with self._database.read() as tx:
            room_row(tx, room_id)
            working = working_in(tx, room_id)
            members = tx.execute(
                "SELECT a.id, a.handle, a.name FROM room_members rm "
                "JOIN agents a ON a.id = rm.agent_id WHERE rm.room_id = ? ORDER BY a.handle",
                (room_id,),
            ).fetchall()
            lines = [failure_line(tx, room_id, a) for a in members]
        return {"working": working, "failures": [line for line in lines if line]}

    def dismiss_room_failure(self, room_id: str, agent_id: str, turn_id: str) -> None:
        """The person dismissed an agent's failure line in a room, at failed turn
        `turn_id`: the line stays away until a later turn fails there."""
        with self._database.write() as tx:
            room_row(tx, room_id)
            row = tx.execute(
                "SELECT agent_id, status, rooms FROM turns WHERE id = ?", (turn_id,)
            ).fetchone()
            if row is None:
                raise NotFound(f"no turn {turn_id}")
            if row["agent_id"] != agent_id:
                raise Invalid(f"turn {turn_id} is not a turn of agent {agent_id}")
            if row["status"] != "failed" or not serves_room(row["rooms"], room_id):
                raise Invalid(f"turn {turn_id} is not a failed turn for this room")
            tx.execute(
                "INSERT INTO room_status_dismissals "
                "(user_id, room_id, agent_id, turn_id, dismissed_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (user_id, room_id, agent_id) DO UPDATE "
                "SET turn_id = excluded.turn_id, dismissed_at = excluded.dismissed_at",
                (WEB_USER, room_id, agent_id, turn_id, tx.now()),
            )
