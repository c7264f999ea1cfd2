"""Rooms and their messages as an agent reads them.

One renderer for both places an agent sees messages: the turn input (the
Computer adds its date line and new-session line on top) and a HELD answer of
`crew reply`. Pure functions over the room/message dicts of
`docs/contracts.md`; standard library only, so the shim stays fast to start.

A section looks like this (a group, a muted group, a thread)::

    ## Group "launch" — members: User (user), Alice (@alice, you), Bob (@bob)
    - [#41 19:12] User (user): @alice can you write the release note? [mentions you] (id 5f1c…)
    - [#42 19:13] Alice (@alice, you): On it. [task #3 in_progress, assigned to @alice] (id 77aa…)
    Reply with: crew reply 7d0c…

    ## Group "random" (you muted it until Tue 2026-10-06 18:00 +08:00) — members: …

    ## Thread in group "launch" (room 7d0c…) — members: User (user), Alice (@alice, you)
    Root: [#40 19:10] User (user): can someone check the build? (id 5f1c…)
    - [#1 19:12] Bob (@bob): on it
    Reply with: crew reply 9e2a…

Message ids are shown in groups only: that is where `crew reply --thread
<message-id>` and `crew task convert <message-id>` need them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, tzinfo
from typing import Any

from crew_shim.times import format_local, parse_rfc3339

ROOT_BODY_LIMIT = 600

Json = Mapping[str, Any]


def render_rooms(
    rooms: Sequence[Json], *, agent_id: str, tz: tzinfo, today: date | None = None
) -> str:
    """Render rooms with their new messages, one section per room, blank line between.

    `rooms` is the `rooms` list of an unread or HELD answer: `[{"room": room,
    "messages": [message, ...]}, ...]`, rendered in the given order.
    `agent_id` is the reading agent (its own messages say `, you`, mentions of
    it end with `[mentions you]`). Times are shown in `tz` as `HH:MM`; a message
    from another day than `today` shows `YYYY-MM-DD HH:MM` (with `today=None`
    every message shows `HH:MM`). Returns the text without a trailing newline.
    """
    return "\n\n".join(
        render_room(
            entry["room"], entry.get("messages") or [], agent_id=agent_id, tz=tz, today=today
        )
        for entry in rooms
    )


def render_room(
    room: Json,
    messages: Sequence[Json],
    *,
    agent_id: str,
    tz: tzinfo,
    today: date | None = None,
) -> str:
    """One room's section: header, (a thread's root message), messages, how to reply."""
    show_ids = room.get("kind") == "group"
    lines = [room_header(room, agent_id=agent_id, tz=tz)]
    root = room.get("root_message")
    if room.get("kind") == "thread" and root:
        root_line = message_line(
            root, agent_id=agent_id, tz=tz, today=today, show_id=True, limit=ROOT_BODY_LIMIT
        )
        lines.append("Root: " + root_line.removeprefix("- "))
    lines.extend(
        message_line(message, agent_id=agent_id, tz=tz, today=today, show_id=show_ids)
        for message in messages
    )
    lines.append(f"Reply with: crew reply {room['id']}")
    return "\n".join(lines)


def room_header(room: Json, *, agent_id: str, tz: tzinfo) -> str:
    """`## Group "launch" (you muted it) — members: User (user), Alice (@alice, you)`."""
    kind = room.get("kind")
    members = ", ".join(
        author_label(member, agent_id=agent_id) for member in room.get("members") or []
    )
    if kind == "dm":
        head = "## Direct chat"
    elif kind == "thread" and room.get("parent_kind") == "dm":
        head = "## Thread in the direct chat"
        if room.get("parent_room_id"):
            head += f" (room {room['parent_room_id']})"
    elif kind == "thread":
        head = f"## Thread in group {_title(room.get('parent_title'))}"
        if room.get("parent_room_id"):
            head += f" (room {room['parent_room_id']})"
    else:
        head = f"## Group {_title(room.get('title'))}"
        if room.get("muted"):
            until = room.get("muted_until")
            head += (
                f" (you muted it until {format_local(parse_rfc3339(until), tz)})"
                if until
                else " (you muted it)"
            )
    return f"{head} — members: {members}" if members else head


def message_line(
    message: Json,
    *,
    agent_id: str,
    tz: tzinfo,
    today: date | None = None,
    show_id: bool = False,
    limit: int | None = None,
) -> str:
    """`- [#41 19:12] User (user): body [tags] (id …)`.

    Tags, in order: `[notice]`, `[task #3 in_progress, assigned to @alice]`,
    `[thread: 2 replies]`, `[mentions you]`. A body over `limit` characters is
    cut and ends with `…`; continuation lines of a body are indented two spaces.
    """
    body = str(message.get("body") or "")
    if limit is not None and len(body) > limit:
        body = body[:limit].rstrip() + "…"
    body = body.replace("\n", "\n  ")
    parts = [f"- [#{message.get('seq')} {_clock(message, tz, today)}]"]
    parts.append(f"{author_label(message.get('author') or {}, agent_id=agent_id)}: {body}")
    parts.extend(_tags(message, agent_id=agent_id))
    if show_id and message.get("id"):
        parts.append(f"(id {message['id']})")
    return " ".join(parts)


def author_label(author: Json, *, agent_id: str) -> str:
    """`User (user)`, `Bob (@bob)`, `Alice (@alice, you)`, `Crew (system)`."""
    kind = author.get("kind")
    name = author.get("name") or author.get("handle") or "Unknown"
    if kind == "agent":
        you = ", you" if agent_id and author.get("id") == agent_id else ""
        return f"{name} (@{author.get('handle')}{you})"
    if kind == "system":
        return f"{name} (system)"
    return f"{name} (user)"


def task_tag(task: Json) -> str:
    """`[task #3 in_progress, assigned to @alice]` or `[task #3 todo, unassigned]`."""
    assignee = task.get("assignee")
    who = f"assigned to @{assignee}" if assignee else "unassigned"
    return f"[task #{task.get('number')} {task.get('status')}, {who}]"


def _tags(message: Json, *, agent_id: str) -> list[str]:
    tags = []
    if message.get("kind") == "notice":
        tags.append("[notice]")
    if message.get("task"):
        tags.append(task_tag(message["task"]))
    thread = message.get("thread")
    if thread and thread.get("replies"):
        count = thread["replies"]
        tags.append(f"[thread: {count} {'reply' if count == 1 else 'replies'}]")
    if agent_id and agent_id in (message.get("mentions") or ()):
        tags.append("[mentions you]")
    return tags


def _clock(message: Json, tz: tzinfo, today: date | None) -> str:
    created = message.get("created_at")
    if not created:
        return "--:--"
    local = parse_rfc3339(created).astimezone(tz)
    if today is not None and local.date() != today:
        return f"{local:%Y-%m-%d %H:%M}"
    return f"{local:%H:%M}"


def _title(title: object) -> str:
    return f'"{title}"' if title else "(untitled)"
