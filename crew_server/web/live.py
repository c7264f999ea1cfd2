"""Live updates for the web app's pages, over SSE.

A page element with `data-live="/live/…"` opens an `EventSource` (static/app.js).
Each stream looks at the store every `POLL_SECONDS` and sends `update` events:
`{"target": <element id>, "mode": "append" | "replace", "html": <rendered fragment>}`,
rendered by the same templates (and the same escaping) as the page. Appends carry
an SSE id (a message's seq, an event's index) so a reconnecting browser resumes
after what it has (`Last-Event-ID`). A stream ends when the server stops (the
`EventHub` is closed) or the browser goes away.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from crew_server.clock import iso
from crew_server.web.access import Web
from crew_server.web.render import fragment
from crew_server.web.session import Session
from crew_server.web.views import agents_with_reasons, int_query, rooms_nav, turn_cost

POLL_SECONDS = 0.4
# Summaries (the rooms list, the roster) cost a query per room or agent: every 5th poll.
SUMMARY_EVERY = 5


@dataclass(frozen=True)
class Update:
    """One change to a page: new content for (or after the end of) an element."""

    target: str
    mode: str  # "append" | "replace" (the inside) | "outer" (the element) | "end"
    html: str = ""
    event_id: int | None = None


Poll = Callable[[], list[Update]]


def every(nth: int, poll: Poll) -> Poll:
    """`poll` on every `nth` call only (the first call included)."""
    calls = 0

    def sometimes() -> list[Update]:
        nonlocal calls
        calls += 1
        return poll() if calls % nth == 1 or nth == 1 else []

    return sometimes


def encoded(update: Update) -> bytes:
    """The SSE event for an update (JSON data on one line)."""
    data = orjson.dumps({"target": update.target, "mode": update.mode, "html": update.html})
    head = f"id: {update.event_id}\n" if update.event_id is not None else ""
    return f"{head}event: update\ndata: ".encode() + data + b"\n\n"


def stream_of(web: Web, session: Session, poll: Poll) -> Response:
    """An open SSE answer sending what `poll` finds, until the server stops, `end`, or
    the session signs out (checked on each poll)."""

    async def updates() -> AsyncIterator[bytes]:
        yield b"retry: 2000\n: connected\n\n"
        while not web.ctx.hub.closed:
            if not web.sessions.alive(session):
                yield encoded(Update("", "signed-out"))
                return
            for update in poll():
                yield encoded(update)
                if update.mode == "end":
                    return
            await anyio.sleep(POLL_SECONDS)

    return StreamingResponse(
        updates(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def resume_after(request: Request, name: str) -> int:
    """Where a stream starts: after the page's position, or after what a reconnecting
    browser last got."""
    after = int_query(request, name) or 0
    last = request.headers.get("last-event-id", "").strip()
    if last.isascii() and last.isdigit() and len(last) <= 15:
        after = max(after, int(last))
    return after


class Changed:
    """Sends an element's fragment again only when it differs from the last one sent."""

    def __init__(self) -> None:
        self._sent: dict[str, str] = {}

    def replace(self, target: str, html: str) -> list[Update]:
        if self._sent.get(target) == html:
            return []
        first = target not in self._sent
        self._sent[target] = html
        # The page was rendered with the first version: no need to send it.
        return [] if first else [Update(target, "replace", html)]


async def room(web: Web, request: Request, session: Session) -> Response:
    """New messages of a room (or thread) as they come; the rooms' unread counts."""
    room_id = request.path_params["room_id"]
    shown = web.store.get_room(room_id)
    is_thread = shown["kind"] == "thread"
    target = "thread-messages" if is_thread else "timeline"
    after = resume_after(request, "after")
    changed = Changed()
    changed.replace("rooms-nav", fragment("_rooms_nav.html", nav_context(web, room_id)))
    nav = every(
        SUMMARY_EVERY,
        lambda: changed.replace(
            "rooms-nav", fragment("_rooms_nav.html", nav_context(web, room_id))
        ),
    )
    threads_seen = iso(web.store.clock.now())

    def threads() -> list[Update]:
        """Messages whose thread got replies: shown again, with the new count."""
        nonlocal threads_seen
        active = web.store.threads_active_since(room_id, threads_seen)
        if active:
            threads_seen = max(str(m["thread"]["last_at"]) for m in active)
        return [
            Update(
                f"m-{m['id']}",
                "outer",
                fragment(
                    "_message.html",
                    {"message": m, "room": shown, "csrf": session.csrf, "in_thread": False},
                ),
            )
            for m in active
        ]

    thread_counts = every(SUMMARY_EVERY, threads)

    def poll() -> list[Update]:
        nonlocal after
        found = web.store.list_messages(room_id, after, 100)
        updates = [
            Update(
                target,
                "append",
                fragment(
                    "_message.html",
                    {"message": m, "room": shown, "csrf": session.csrf, "in_thread": is_thread},
                ),
                m["seq"],
            )
            for m in found
        ]
        if found:
            after = found[-1]["seq"]
            if not is_thread:
                # The person is looking at this room: what arrives is read.
                web.store.mark_read_by_user(room_id, after)
        if not is_thread:
            updates += nav() + thread_counts()
        return updates

    return stream_of(web, session, poll)


async def rooms(web: Web, request: Request, session: Session) -> Response:
    """The rooms list with its unread counts as they change."""
    changed = Changed()

    def render() -> str:
        return fragment("_rooms_nav.html", nav_context(web, None))

    changed.replace("rooms-nav", render())
    return stream_of(
        web, session, every(SUMMARY_EVERY, lambda: changed.replace("rooms-nav", render()))
    )


def nav_context(web: Web, current: str | None) -> dict[str, object]:
    return {"rooms": rooms_nav(web), "current": current}


async def roster(web: Web, request: Request, session: Session) -> Response:
    """The agents' statuses as they change."""
    changed = Changed()

    def render() -> str:
        return fragment("_roster.html", {"roster": agents_with_reasons(web)})

    changed.replace("roster", render())
    return stream_of(web, session, every(2, lambda: changed.replace("roster", render())))


async def agent(web: Web, request: Request, session: Session) -> Response:
    """One agent's status and turn list as they change."""
    agent_id = request.path_params["agent_id"]
    web.store.get_agent(agent_id)
    changed = Changed()

    def poll() -> list[Update]:
        shown = next(a for a in agents_with_reasons(web) if a["id"] == agent_id)
        turns = web.store.list_turns(agent_id, 50)
        return changed.replace(
            "agent-status", fragment("_agent_status.html", {"agent": shown})
        ) + changed.replace("agent-turns", fragment("_turn_rows.html", {"turns": turns}))

    poll()
    return stream_of(web, session, every(2, poll))


async def turn(web: Web, request: Request, session: Session) -> Response:
    """A running turn's events as they come, its summary as it changes; ends with the turn."""
    turn_id = request.path_params["turn_id"]
    start = web.store.get_turn(turn_id)
    # The page shows the events before `from`; a reconnecting browser has up to its last id.
    next_index = int_query(request, "from") or 0
    last = request.headers.get("last-event-id", "").strip()
    if last.isascii() and last.isdigit() and len(last) <= 15:
        next_index = max(next_index, int(last) + 1)
    # The cost of a running turn is summed from its steps: keep them all.
    steps = [e for e in start["events"] if e["type"] == "step_finish"]
    changed = Changed()
    changed.replace("turn-summary", fragment("_turn_summary.html", summary_context(start, steps)))

    def poll() -> list[Update]:
        nonlocal next_index
        shown = web.store.get_turn(turn_id, next_index)
        new = shown["events"]
        updates = [
            Update("turn-events", "append", fragment("_turn_event.html", {"event": e}), e["index"])
            for e in new
        ]
        if new:
            next_index = new[-1]["index"] + 1
            steps.extend(e for e in new if e["type"] == "step_finish")
        summary = fragment("_turn_summary.html", summary_context(shown, steps))
        updates += changed.replace("turn-summary", summary)
        if shown["status"] != "running" and not new:
            updates.append(Update("turn-events", "end"))
        return updates

    return stream_of(web, session, poll)


def summary_context(shown: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """What the turn's summary shows: its recorded usage, or the sum of its steps so far."""
    return {"turn": shown, "cost": turn_cost({**shown, "events": steps})}
