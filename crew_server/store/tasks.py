"""Tasks: numbered work hosted on a message of a dm or group, discussed in its thread."""

from __future__ import annotations

import sqlite3
from typing import Any

from crew_server import rules
from crew_server.errors import NotFound, Refused
from crew_server.store.db import StorePart, Transaction
from crew_server.store.identities import USER, Actor
from crew_server.store.messages import open_thread, post
from crew_server.store.rooms import is_member, member_room, require_member, room_row

TASK_SELECT = (
    "SELECT t.number, t.title, t.status, a.handle AS assignee, t.room_id, t.host_message_id, "
    "t.thread_id, t.assignee_id FROM tasks t LEFT JOIN agents a ON a.id = t.assignee_id "
)


def task_of(r: sqlite3.Row) -> dict[str, Any]:
    """A `TASK_SELECT` row as the API shows it."""
    return {
        "number": r["number"],
        "title": r["title"],
        "status": r["status"],
        "assignee": r["assignee"],
        "room_id": r["room_id"],
        "host_message_id": r["host_message_id"],
        "thread_id": r["thread_id"],
    }


def task_row(tx: Transaction, number: int, room_id: str | None = None) -> sqlite3.Row:
    """The task; when the caller names a room, it must be the task's room or thread."""
    row = tx.execute(TASK_SELECT + "WHERE t.number = ?", (number,)).fetchone()
    if row is None:
        raise NotFound(f"no task #{number}")
    if room_id is not None and room_id not in (row["room_id"], row["thread_id"]):
        raise NotFound(f"task #{number} is not in room {room_id}; list that room's tasks first")
    return row


def agent_by_handle(tx: Transaction, room_id: str, handle: str) -> str:
    """The id of the member of `room_id` with this handle (Refused when none)."""
    handle = handle.removeprefix("@")
    row = tx.execute("SELECT id FROM agents WHERE handle = ?", (handle,)).fetchone()
    if row is None:
        raise Refused(f"there is no agent @{handle}; check the handle")
    if not is_member(tx, room_id, row["id"]):
        raise Refused(f"@{handle} is not a member of this room; assign the task to a member")
    return str(row["id"])


def check_actor_in(tx: Transaction, actor: Actor, room_id: str) -> None:
    """An agent must be a member of the room; the user needs only that it exists."""
    if actor.kind == "agent":
        require_member(tx, room_id, actor.id)
    else:
        room_row(tx, room_id)


def new_task(
    tx: Transaction, actor: Actor, room_id: str, host_id: str, title: str, assignee: str | None
) -> dict[str, Any]:
    """Insert a task hosted on `host_id` and post the 'created' notice in its thread."""
    assignee_id = agent_by_handle(tx, room_id, assignee) if assignee else None
    thread_id, _ = open_thread(tx, host_id)
    now = tx.now()
    number = tx.execute(
        "INSERT INTO tasks (title, status, assignee_id, room_id, host_message_id, thread_id, "
        "created_at, updated_at) VALUES (?, 'todo', ?, ?, ?, ?, ?, ?) RETURNING number",
        (title, assignee_id, room_id, host_id, thread_id, now, now),
    ).fetchone()["number"]
    actor_text = rules.actor_text(actor.handle)
    detail = ""
    if assignee_id is not None:
        detail = f", assigned to @{assignee.removeprefix('@') if assignee else ''}"
    wakes = [assignee_id] if assignee_id and assignee_id != actor.id else []
    post(
        tx,
        thread_id,
        None,
        rules.task_notice("created", number, actor_text, detail=detail),
        notice_wakes=wakes,
        caused_by=actor,
    )
    return task_of(task_row(tx, number))


class Tasks(StorePart):
    """Creating, converting, claiming, moving and assigning tasks."""

    def list_tasks(self, actor: Actor, room_id: str | None) -> list[dict[str, Any]]:
        """Tasks of a room (a thread stands for its group), or all the actor can see."""
        with self._database.read() as tx:
            if room_id is None:
                if actor.kind == "agent":
                    rows = tx.execute(
                        TASK_SELECT + "JOIN room_members rm ON rm.room_id = t.room_id "
                        "WHERE rm.agent_id = ? ORDER BY t.number",
                        (actor.id,),
                    ).fetchall()
                else:
                    rows = tx.execute(TASK_SELECT + "ORDER BY t.number").fetchall()
            else:
                check_actor_in(tx, actor, room_id)
                rows = tx.execute(
                    TASK_SELECT + "WHERE t.room_id = ? ORDER BY t.number",
                    (member_room(tx, room_id),),
                ).fetchall()
        return [task_of(r) for r in rows]

    def create_task(
        self, actor: Actor, room_id: str, title: str, assignee: str | None
    ) -> dict[str, Any]:
        """A task hosted on a new message (its title) in the room; its thread gets a notice."""
        with self._database.write() as tx:
            check_actor_in(tx, actor, room_id)
            # Tasks live in dms and groups; a thread stands for its group.
            room = member_room(tx, room_id)
            host = post(tx, room, actor if actor.kind == "agent" else USER, title)
            return new_task(tx, actor, room, host["id"], title, assignee)

    def convert_task(self, actor: Actor, message_id: str, assignee: str | None) -> dict[str, Any]:
        """Turn an existing message into a task hosted on it (title: its first line)."""
        with self._database.write() as tx:
            row = tx.execute(
                "SELECT m.room_id, m.body, r.kind FROM messages m JOIN rooms r ON r.id = m.room_id "
                "WHERE m.id = ?",
                (message_id,),
            ).fetchone()
            if row is None:
                raise NotFound(f"no message {message_id}")
            room_id = row["room_id"]
            check_actor_in(tx, actor, room_id)
            if row["kind"] == "thread":
                raise Refused(
                    "a message inside a thread cannot become a task; convert the thread's first message"
                )
            existing = tx.execute(
                "SELECT number FROM tasks WHERE host_message_id = ?", (message_id,)
            ).fetchone()
            if existing is not None:
                raise Refused(f"that message is already task #{existing['number']}")
            title = (row["body"].strip().splitlines() or [""])[0][:200] or "(untitled)"
            return new_task(tx, actor, room_id, message_id, title, assignee)

    def claim_task(self, actor: Actor, number: int, room_id: str | None = None) -> dict[str, Any]:
        """The actor takes the task (refused when someone else holds it)."""
        with self._database.write() as tx:
            row = task_row(tx, number, room_id)
            check_actor_in(tx, actor, row["room_id"])
            holder = row["assignee_id"]
            if holder is not None and holder != actor.id:
                raise Refused(
                    f"task #{number} is assigned to @{row['assignee']}; only @{row['assignee']} "
                    "or the user can hand it over — ask them to assign it to you"
                )
            status = "in_progress" if row["status"] == "todo" else row["status"]
            tx.execute(
                "UPDATE tasks SET assignee_id = ?, status = ?, updated_at = ? WHERE number = ?",
                (actor.id, status, tx.now(), number),
            )
            post(
                tx,
                row["thread_id"],
                None,
                rules.task_notice("claimed", number, rules.actor_text(actor.handle)),
                caused_by=actor,
            )
            return task_of(task_row(tx, number))

    def set_task_status(
        self, actor: Actor, number: int, status: str, note: str | None, room_id: str | None = None
    ) -> dict[str, Any]:
        """Move a task (agents: only their own) and post the notice in its thread."""
        with self._database.write() as tx:
            row = task_row(tx, number, room_id)
            check_actor_in(tx, actor, row["room_id"])
            holder = row["assignee_id"]
            if actor.kind == "agent":
                if holder is None:
                    raise Refused(
                        f"task #{number} has no assignee; claim it first (crew task claim {number})"
                    )
                if holder != actor.id:
                    raise Refused(
                        f"only the assignee (@{row['assignee']}) or the user can move task #{number}"
                    )
            tx.execute(
                "UPDATE tasks SET status = ?, updated_at = ? WHERE number = ?",
                (status, tx.now(), number),
            )
            wakes = [holder] if holder is not None and holder != actor.id else []
            text = rules.task_notice(
                "status",
                number,
                rules.actor_text(actor.handle),
                detail=status,
                note=(note or "").strip(),
            )
            post(tx, row["thread_id"], None, text, notice_wakes=wakes, caused_by=actor)
            return task_of(task_row(tx, number))

    def assign_task(
        self, actor: Actor, number: int, assignee: str, room_id: str | None = None
    ) -> dict[str, Any]:
        """Hand a task to a member (agents: when unassigned or their own)."""
        with self._database.write() as tx:
            row = task_row(tx, number, room_id)
            check_actor_in(tx, actor, row["room_id"])
            holder = row["assignee_id"]
            if actor.kind == "agent" and holder is not None and holder != actor.id:
                raise Refused(
                    f"task #{number} is assigned to @{row['assignee']}; only @{row['assignee']} "
                    "or the user can reassign it"
                )
            assignee_id = agent_by_handle(tx, row["room_id"], assignee)
            tx.execute(
                "UPDATE tasks SET assignee_id = ?, updated_at = ? WHERE number = ?",
                (assignee_id, tx.now(), number),
            )
            wakes = [assignee_id] if assignee_id != actor.id else []
            text = rules.task_notice(
                "assigned",
                number,
                rules.actor_text(actor.handle),
                detail=f"@{assignee.removeprefix('@')}",
            )
            post(tx, row["thread_id"], None, text, notice_wakes=wakes, caused_by=actor)
            return task_of(task_row(tx, number))
