"""Live updates for the web app's pages: one SSE stream per browser, shared by its tabs.

A browser allows six connections to a host, so a stream per page (or per element)
left the 7th tab of a room unable to load. A page element with `data-live="/live/…"`
names a *topic*; the page's script (static/app.js) hands its topics to one
SharedWorker (static/live-worker.js; in a browser without SharedWorker the page does
it itself, static/live-hub.js), which holds the browser's one `EventSource` on
`GET /live`. That stream first sends its id (`hello`); the worker then subscribes
each tab's topics to it (`POST /live/subscriptions`, with the session's CSRF token)
and unsubscribes them when a tab goes (`POST /live/subscriptions/leave`).

Each stream looks at the store every `POLL_SECONDS` for each of its subscriptions and
sends `update` events, `{"key", "target", "mode", "html", "id"}`: `key` is the
subscription (which tab), `target` an element id, `mode` "append" | "replace" |
"outer" | "end", `html` a fragment rendered by the same templates (and escaping) as
the page, `id` a message's seq or an event's index, which a resubscription after a
reconnect passes back as `last` so nothing is sent twice. A stream ends when the
server stops (the `EventHub` is closed), the browser goes away, or its session signs
out (checked on each poll; the stream says `signed-out` first).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from crew_server.clock import iso
from crew_server.errors import ApiError, Invalid
from crew_server.web.access import Form, Web
from crew_server.web.render import SECURITY_HEADERS, fragment
from crew_server.web.room_status import room_status
from crew_server.web.session import Session
from crew_server.web.streams import Poll, Update
from crew_server.web.views import agents_with_reasons, rooms_nav, turn_cost, with_running_turn

POLL_SECONDS = 0.4
# Summaries (the rooms list, the roster) cost a query per room or agent: every 5th poll.
SUMMARY_EVERY = 5
KEY_CHARS = 100


def every(nth: int, poll: Poll) -> Poll:
    """`poll` on every `nth` call only (the first call included)."""
    calls = 0

    def sometimes() -> list[Update]:
        nonlocal calls
        calls += 1
        return poll() if calls % nth == 1 or nth == 1 else []

    return sometimes


def encoded(key: str, update: Update) -> bytes:
    """The SSE event for a subscription's update (JSON data on one line)."""
    data = orjson.dumps(
        {
            "key": key,
            "target": update.target,
            "mode": update.mode,
            "html": update.html,
            "id": update.event_id,
        }
    )
    return b"event: update\ndata: " + data + b"\n\n"


def notice(data: dict[str, str]) -> bytes:
    """An SSE event about the stream itself (`hello`, `signed-out`)."""
    return b"event: update\ndata: " + orjson.dumps(data) + b"\n\n"


async def browser(web: Web, request: Request, session: Session) -> Response:
    """`GET /live`: this browser's stream, carrying what its tabs subscribe to."""
    stream = web.live.open(session)

    async def updates() -> AsyncIterator[bytes]:
        try:
            yield b"retry: 2000\n" + notice({"mode": "hello", "stream": stream.stream_id})
            while not web.ctx.hub.closed and not stream.closed:
                if not web.sessions.alive(session):
                    yield notice({"mode": "signed-out"})
                    return
                for key, poll in list(stream.polls.items()):
                    for update in polled(poll):
                        yield encoded(key, update)
                        if update.mode == "end":
                            stream.polls.pop(key, None)
                await anyio.sleep(POLL_SECONDS)
        finally:
            web.live.close(stream)

    return StreamingResponse(
        updates(),
        media_type="text/event-stream",
        headers={**SECURITY_HEADERS, "X-Accel-Buffering": "no"},
    )


def polled(poll: Poll) -> list[Update]:
    """What a subscription's poll found; a topic that went away (a deleted room) ends."""
    try:
        return poll()
    except ApiError as exc:
        return [Update("", "end", exc.message)]


async def subscribe(web: Web, request: Request, session: Session, form: Form) -> Response:
    """`POST /live/subscriptions`: a tab's topic on this browser's stream."""
    stream = web.live.of(session, form.get("stream"))
    key = form.get("key")
    if not key or len(key) > KEY_CHARS:
        raise Invalid(f"key must be 1 to {KEY_CHARS} characters")
    last = form.get("last").strip()
    if last and not (last.isascii() and last.isdigit() and len(last) <= 15):
        raise Invalid("last must be the id of the last update the tab got")
    stream.subscribe(key, topic_poll(web, session, form.get("topic"), int(last) if last else None))
    return Response(status_code=204, headers=SECURITY_HEADERS)


async def leave(web: Web, request: Request, session: Session, form: Form) -> Response:
    """`POST /live/subscriptions/leave`: a tab went; its topics stop."""
    stream = web.live.of(session, form.get("stream"))
    for key in form.all("key"):
        stream.polls.pop(key, None)
    return Response(status_code=204, headers=SECURITY_HEADERS)


_UUID = r"[0-9a-fA-F-]{36}"
Topic = Callable[[Web, Session, dict[str, str], int, int | None], Poll]


def topic_poll(web: Web, session: Session, topic: str, last: int | None) -> Poll:
    """The poll of a topic as a page names it (`/live/rooms/<id>?after=<seq>`); `last`
    is what the tab got already (after a reconnect)."""
    parts = urlsplit(topic)
    query = parse_qs(parts.query)
    for pattern, start in TOPICS:
        found = pattern.fullmatch(parts.path)
        if found:
            raw = (query.get("after") or query.get("from") or ["0"])[0]
            if not (raw.isascii() and raw.isdigit() and len(raw) <= 15):
                raise Invalid("a topic's after/from must be a position, like 12")
            return start(web, session, found.groupdict(), int(raw), last)
    raise Invalid(f"there is no live topic {topic[:80]!r}")


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


def room(web: Web, session: Session, path: dict[str, str], after: int, last: int | None) -> Poll:
    """New messages of a room (or thread) as they come; the rooms' unread counts."""
    room_id = path["room_id"]
    shown = web.store.get_room(room_id)
    is_thread = shown["kind"] == "thread"
    target = "thread-messages" if is_thread else "timeline"
    after = max(after, last or 0)
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

    status_sent: str | None = None

    def status() -> list[Update]:
        """The line under the timeline: who works, whose turns failed (issue 25). Sent
        on the first poll too: the page may have been rendered a while before."""
        nonlocal status_sent
        context = {
            "status": room_status(web, room_id),
            "room": shown,
            "csrf": session.csrf,
            "here": f"/rooms/{room_id}",
        }
        html = fragment("_room_status.html", context)
        if html == status_sent:
            return []
        status_sent = html
        return [Update("room-status", "replace", html)]

    approvals_seen = threads_seen
    # The state each card was last sent in (a frozen clock gives equal times).
    card_states: dict[str, str] = {}

    def answered_cards() -> list[Update]:
        """Approval cards answered or expired since the last look: shown again (issue 24)."""
        nonlocal approvals_seen
        now = iso(web.store.clock.now())
        web.store.expire_due_approvals()
        changed_ids = web.store.room_approvals_changed(room_id, approvals_seen)
        approvals_seen = now
        updates = []
        for message_id in dict.fromkeys(changed_ids):
            m = web.store.get_message(message_id)
            state = m["approval"]["state"] if m["approval"] else ""
            if card_states.get(message_id) == state:
                continue
            card_states[message_id] = state
            context = {"message": m, "room": shown, "csrf": session.csrf, "in_thread": is_thread}
            target = f"{'t' if is_thread else 'm'}-{m['id']}"
            updates.append(Update(target, "outer", fragment("_message.html", context)))
        return updates

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
        updates += answered_cards()
        if not is_thread:
            updates += nav() + thread_counts() + status()
        return updates

    return poll


def rooms(web: Web, session: Session, path: dict[str, str], after: int, last: int | None) -> Poll:
    """The rooms list with its unread counts as they change."""
    changed = Changed()

    def render() -> str:
        return fragment("_rooms_nav.html", nav_context(web, None))

    changed.replace("rooms-nav", render())
    return every(SUMMARY_EVERY, lambda: changed.replace("rooms-nav", render()))


def nav_context(web: Web, current: str | None) -> dict[str, object]:
    return {"rooms": rooms_nav(web), "current": current}


def roster(web: Web, session: Session, path: dict[str, str], after: int, last: int | None) -> Poll:
    """The agents' statuses as they change."""
    changed = Changed()

    def render() -> str:
        return fragment("_roster.html", {"roster": agents_with_reasons(web)})

    changed.replace("roster", render())
    return every(2, lambda: changed.replace("roster", render()))


def agent(web: Web, session: Session, path: dict[str, str], after: int, last: int | None) -> Poll:
    """One agent's status and turn list as they change."""
    agent_id = path["agent_id"]
    web.store.get_agent(agent_id)
    changed = Changed()

    def poll() -> list[Update]:
        shown = next(a for a in agents_with_reasons(web) if a["id"] == agent_id)
        turns = web.store.list_turns(agent_id, 50)
        controls = {"agent": with_running_turn(web, shown), "csrf": session.csrf}
        return (
            changed.replace("agent-status", fragment("_agent_status.html", {"agent": shown}))
            + changed.replace("agent-turns", fragment("_turn_rows.html", {"turns": turns}))
            + changed.replace(
                "agent-controls",
                fragment("_agent_controls.html", {**controls, "here": f"/agents/{agent_id}"}),
            )
        )

    # The page may be older than this subscription (a turn started or ended while it
    # loaded, as after a Stop's redirect): its version is unknown, so the first poll sends all.
    for target in ("agent-status", "agent-turns", "agent-controls"):
        changed.replace(target, "")
    return every(2, poll)


def turn(web: Web, session: Session, path: dict[str, str], after: int, last: int | None) -> Poll:
    """A running turn's events as they come, its summary as it changes; ends with the turn."""
    turn_id = path["turn_id"]
    start = web.store.get_turn(turn_id)
    # The page shows the events before `from` (`after` here); the tab has up to `last`.
    next_index = after if last is None else max(after, last + 1)
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

    return poll


def summary_context(shown: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """What the turn's summary shows: its recorded usage, or the sum of its steps so far."""
    return {"turn": shown, "cost": turn_cost({**shown, "events": steps})}


TOPICS: list[tuple[re.Pattern[str], Topic]] = [
    (re.compile(r"/live/rooms"), rooms),
    (re.compile(rf"/live/rooms/(?P<room_id>{_UUID})"), room),
    (re.compile(r"/live/agents"), roster),
    (re.compile(rf"/live/agents/(?P<agent_id>{_UUID})"), agent),
    (re.compile(rf"/live/turns/(?P<turn_id>{_UUID})"), turn),
]
