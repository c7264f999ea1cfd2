"""Rooms: dms, groups and the threads hanging off group messages; who belongs to them."""

from __future__ import annotations

import sqlite3
from typing import Any

from crew_server.errors import Forbidden, Invalid, NotFound
from crew_server.store.db import StorePart, Transaction, new_id
from crew_server.store.loop_guard import guard_view
from crew_server.store.message_view import USER_AUTHOR, select_messages


def room_row(tx: Transaction, room_id: str) -> sqlite3.Row:
    """The room's row (id, kind, title, parent_room_id, root_message_id, last_seq)."""
    row = tx.execute(
        "SELECT id, kind, title, parent_room_id, root_message_id, last_seq FROM rooms WHERE id = ?",
        (room_id,),
    ).fetchone()
    if row is None:
        raise NotFound(f"no room {room_id}")
    return row


def member_room(tx: Transaction, room_id: str) -> str:
    """The room whose members count (and that holds tasks): a thread's group, else the room."""
    row = room_row(tx, room_id)
    if row["kind"] == "thread" and row["parent_room_id"]:
        return str(row["parent_room_id"])
    return str(row["id"])


def members(tx: Transaction, room_id: str) -> list[tuple[str, str, str]]:
    """(agent id, handle, name) of a room's agents (a thread's: its group's), by handle."""
    base = member_room(tx, room_id)
    rows = tx.execute(
        "SELECT a.id, a.handle, a.name FROM room_members rm JOIN agents a ON a.id = rm.agent_id "
        "WHERE rm.room_id = ? ORDER BY a.handle",
        (base,),
    )
    return [(r["id"], r["handle"], r["name"]) for r in rows]


def is_member(tx: Transaction, room_id: str, agent_id: str) -> bool:
    """Whether the agent belongs to the room (to a thread's group)."""
    base = member_room(tx, room_id)
    return (
        tx.execute(
            "SELECT 1 FROM room_members WHERE room_id = ? AND agent_id = ?", (base, agent_id)
        ).fetchone()
        is not None
    )


def require_member(tx: Transaction, room_id: str, agent_id: str) -> None:
    """Forbidden unless the agent belongs to the room."""
    row = room_row(tx, room_id)
    if is_member(tx, room_id, agent_id):
        return
    if row["kind"] == "dm":
        raise Forbidden("that room is a direct conversation between the user and another agent")
    raise Forbidden("you are not a member of that room; answer only in rooms you were given")


def room_view(tx: Transaction, room_id: str, for_agent: str | None) -> dict[str, Any]:
    """The room as the API shows it (to `for_agent`: with its mute; else to the user)."""
    row = room_row(tx, room_id)
    rid, kind = row["id"], row["kind"]
    parent_id, root_id = row["parent_room_id"], row["root_message_id"]
    people: list[dict[str, Any]] = [dict(USER_AUTHOR)]
    people += [{"kind": "agent", "id": a, "name": n, "handle": h} for a, h, n in members(tx, rid)]
    parent_title = parent_kind = None
    root_message = None
    if kind == "thread" and parent_id is not None:
        parent = tx.execute("SELECT title, kind FROM rooms WHERE id = ?", (parent_id,)).fetchone()
        parent_title, parent_kind = parent["title"], parent["kind"]
        if root_id is not None:
            found = select_messages(tx, "WHERE m.id = ?", (root_id,))
            root_message = found[0] if found else None
    muted, until = False, None
    if for_agent is not None and kind == "group":
        mute = tx.execute(
            "SELECT until FROM mutes WHERE agent_id = ? AND room_id = ? "
            "AND (until IS NULL OR until > ?)",
            (for_agent, rid, tx.now()),
        ).fetchone()
        if mute is not None:
            muted, until = True, mute["until"]
    return {
        "id": rid,
        "kind": kind,
        "title": row["title"],
        "members": people,
        "parent_room_id": parent_id,
        "root_message_id": root_id,
        "parent_title": parent_title,
        "parent_kind": parent_kind,
        "root_message": root_message,
        "muted": muted,
        "muted_until": until,
        **guard_view(tx, rid),
    }


class Rooms(StorePart):
    """Creating and reading dms and groups (threads come with messages)."""

    def create_room(
        self, kind: str, title: str | None, agent_ids: list[str]
    ) -> tuple[dict[str, Any], bool]:
        """A dm (the user and one agent; reused when it exists) or a group. (room, created)."""
        ids = list(dict.fromkeys(agent_ids))
        if kind == "dm" and len(ids) != 1:
            raise Invalid("a dm has exactly one agent; give one id in agent_ids")
        if kind == "group" and not (title and title.strip()):
            raise Invalid("a group needs a title")
        with self._database.write() as tx:
            for agent_id in ids:
                if (
                    tx.execute(
                        "SELECT 1 FROM agents WHERE id = ? AND deleted_at IS NULL", (agent_id,)
                    ).fetchone()
                    is None
                ):
                    raise NotFound(f"no agent {agent_id}; create it first")
            if kind == "dm":
                row = tx.execute(
                    "SELECT r.id FROM rooms r JOIN room_members rm ON rm.room_id = r.id "
                    "WHERE r.kind = 'dm' AND rm.agent_id = ?",
                    (ids[0],),
                ).fetchone()
                if row is not None:
                    return room_view(tx, row["id"], None), False
            room_id = new_id()
            tx.execute(
                "INSERT INTO rooms (id, kind, title, created_at) VALUES (?, ?, ?, ?)",
                (room_id, kind, title if kind == "group" else None, tx.now()),
            )
            tx.executemany("INSERT INTO room_members VALUES (?, ?)", [(room_id, a) for a in ids])
            tx.executemany(
                "INSERT INTO positions (agent_id, room_id) VALUES (?, ?)",
                [(a, room_id) for a in ids],
            )
            return room_view(tx, room_id, None), True

    def get_room(self, room_id: str) -> dict[str, Any]:
        """One room as the user sees it."""
        with self._database.read() as tx:
            return room_view(tx, room_id, None)

    def list_rooms(self) -> list[dict[str, Any]]:
        """Every dm and group, oldest first."""
        with self._database.read() as tx:
            ids = [
                r["id"]
                for r in tx.execute(
                    "SELECT id FROM rooms WHERE kind != 'thread' ORDER BY created_at, id"
                )
            ]
            return [room_view(tx, i, None) for i in ids]
