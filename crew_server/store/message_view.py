"""How a stored message reads: one SELECT (author, task, thread joined in) and its mapping.

Apart from `messages` so that rooms (a thread's root message) and claims can read
messages without depending on how they are posted.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from crew_server.store.approval_state import FIELDS as APPROVAL_FIELDS
from crew_server.store.approval_state import approval_of
from crew_server.store.db import Transaction

USER_AUTHOR: dict[str, Any] = {"kind": "user", "id": "user", "name": "User", "handle": None}
SYSTEM_AUTHOR: dict[str, Any] = {"kind": "system", "id": "system", "name": "Crew", "handle": None}

MESSAGE_SELECT = """
SELECT m.id, m.room_id, m.seq, m.author_kind, m.author_id,
       CASE WHEN a.deleted_at IS NULL THEN a.name ELSE a.name || ' (deleted)' END AS author_name,
       CASE WHEN a.deleted_at IS NULL THEN a.handle END AS author_handle, m.body, m.kind, m.mentions, m.thread_id, m.thread_replies,
       m.thread_last_at, m.created_at, t.number AS task_number, t.title AS task_title,
       t.status AS task_status, ta.handle AS task_assignee,
       {approval}
FROM messages m
LEFT JOIN agents a ON a.id = m.author_id
LEFT JOIN tasks t ON t.host_message_id = m.id
LEFT JOIN agents ta ON ta.id = t.assignee_id
LEFT JOIN approvals ap ON ap.message_id = m.id
""".replace("{approval}", ", ".join(f"ap.{name} AS ap_{name}" for name in APPROVAL_FIELDS))


def message_of(r: sqlite3.Row, now: str | None = None) -> dict[str, Any]:
    """A `MESSAGE_SELECT` row as the API shows it (an approval card with its approval, as
    of `now`: `approval_state.approval_of`)."""
    if r["author_kind"] == "agent":
        author = {
            "kind": "agent",
            "id": r["author_id"],
            "name": r["author_name"],
            "handle": r["author_handle"],
        }
    elif r["author_kind"] == "user":
        author = USER_AUTHOR
    else:
        author = SYSTEM_AUTHOR
    return {
        "id": r["id"],
        "room_id": r["room_id"],
        "seq": r["seq"],
        "author": author,
        "body": r["body"],
        "kind": r["kind"],
        "mentions": orjson.loads(r["mentions"]),
        "task": (
            {
                "number": r["task_number"],
                "title": r["task_title"],
                "status": r["task_status"],
                "assignee": r["task_assignee"],
            }
            if r["task_number"] is not None
            else None
        ),
        "thread": (
            {"id": r["thread_id"], "replies": r["thread_replies"], "last_at": r["thread_last_at"]}
            if r["thread_id"] is not None
            else None
        ),
        "created_at": r["created_at"],
        "approval": (
            approval_of({name: r[f"ap_{name}"] for name in APPROVAL_FIELDS}, now)
            if r["ap_id"] is not None
            else None
        ),
    }


def select_messages(tx: Transaction, where: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    """The messages `MESSAGE_SELECT` + `where` finds, mapped."""
    now = tx.now()
    return [message_of(r, now) for r in tx.execute(MESSAGE_SELECT + where, params)]
