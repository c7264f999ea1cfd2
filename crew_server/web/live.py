"""Live updates for the web app's pages: one SSE stream per browser, shared by its tabs.

A browser allows six connections to a host, so a stream per page (or per element)
left the 7th tab of a room unable to load. A page element with `data-live="/live/…"`
names a *topic*; the page's script (static/app.js) hands its topics to one
SharedWorker (static/live-worker.js; in a browser without SharedWorker the page does
it itself, static/live-hub.js), which holds the browser's one `EventSource` on
`GET /live`. That stream first sends its id (`hello`); the worker then subscribes
each tab's topics to it (`POST /live/subscriptions`, with the session's CSRF token)
and unsubscribes them when a tab goes (`POST /live/subscriptions/leave`).

Each stream looks at the store for each of its subscriptions when the store changed
(pushed, not polled: every write that changed rows wakes the streams, in this process
directly, in another process sharing PostgreSQL by NOTIFY; `streams.py`), after a
short `COALESCE_SECONDS` so a burst of commits makes one look, and at least every
`SAFETY_SECONDS` (what the clock alone changes: a session's expiry, a moved dev clock,
and any change a signal missed). It sends `update` events, `{"key", "target", "mode",
"html", "id"}`: `key` is the subscription (which tab), `target` an element id, `mode`
"append" | "replace" | "outer" | "end", `html` a fragment rendered by the same
templates (and escaping) as the page, `id` a message's seq or an event's index, which
a resubscription after a reconnect passes back as `last` so nothing is sent twice. A
stream ends when the server stops (the `EventHub` is closed: it wakes the streams),
the browser goes away, or its session signs out (checked on each look, and a sign-out
wakes the streams; the stream says `signed-out` first).

Summaries that cost a query per room or agent (the rooms list, the roster) are
throttled by time (`every`): at most once per interval, and once more at its end when
the stream was woken in between (`look_again_at`); never without a wake since it ran,
or the throttles alone would keep an idle stream looking.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
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
from crew_server.web.streams import BrowserStream, Poll, Update
from crew_server.web.turn_events import call_id_of, open_starts
from crew_server.web.views import agents_with_reasons, rooms_nav, turn_cost, with_running_turn

# A burst of commits (a turn's events, a post and its read mark) makes one look.
COALESCE_SECONDS = 0.02
# The slow look when nothing was signalled. CREW_WEB_LIVE=poll ignores the signals and
# looks every POLL_SECONDS, as the web app did before push: for `scripts/bench web` only.
SAFETY_SECONDS = 5.0
POLL_SECONDS = 0.4
# Summaries cost a query per room or agent: the rooms list at most every 2 s, statuses
# every 0.5 s (seconds, not looks: a busy store wakes the streams often).
SUMMARY_EVERY = 2.0
STATUS_EVERY = 0.5
KEY_CHARS = 100


@dataclass
class _Look:
    """The stream's look being run: how many times its stream was woken so far (by a
    change or its safety interval), and when throttled polls want another look."""

    wakes: int
    again: list[float] = field(default_factory=list)


_looking: ContextVar[_Look] = ContextVar("looking")


def look_again_at(when: float) -> None:
    """Ask the stream running this poll for another look at `when` (time.monotonic),
    even if nothing changes: a throttled summary, a clock shown on the page."""
    current = _looking.get(None)
    if current is not None:
        current.again.append(when)


def every(seconds: float, poll: Poll) -> Poll:
    """`poll` at most once per `seconds` (the first call runs it). A call in between asks
    for a look when the interval ends, so the last change is not left unsent; a look
    that no wake came before since it last ran (such a later look) skips it."""
    last: float | None = None
    last_wakes: int | None = None

    def sometimes() -> list[Update]:
        nonlocal last, last_wakes
        current = _looking.get(None)
        wakes = current.wakes if current is not None else None
        if wakes is not None and wakes == last_wakes:
            return []  # nothing happened since it ran
        now = time.monotonic()
        if last is None or now - last >= seconds:
            last, last_wakes = now, wakes
            return poll()
        look_again_at(last + seconds)
        return []

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
        wakes = 0
        try:
            yield b"retry: 2000\n" + notice({"mode": "hello", "stream": stream.stream_id})
            while not web.ctx.hub.closed and not stream.closed:
                if not web.sessions.alive(session):
                    yield notice({"mode": "signed-out"})
                    return
                stream.wake.clear()
                found, again_at = look(stream, wakes)
                for key, update in found:
                    yield encoded(key, update)
                if await next_change(stream, again_at):
                    wakes += 1
        finally:
            web.live.close(stream)

    return StreamingResponse(
        updates(),
        media_type="text/event-stream",
        headers={**SECURITY_HEADERS, "X-Accel-Buffering": "no"},
    )


def look(stream: BrowserStream, wakes: int) -> tuple[list[tuple[str, Update]], float]:
    """Every subscription's poll once (the stream was woken `wakes` times so far): their
    updates (a topic that ended is dropped), and when a throttled one wants another look
    (monotonic; infinity when none does)."""
    current = _Look(wakes)
    token = _looking.set(current)
    try:
        found = []
        for key, poll in list(stream.polls.items()):
            for update in polled(poll):
                found.append((key, update))
                if update.mode == "end":
                    stream.polls.pop(key, None)
    finally:
        _looking.reset(token)
    return found, min(current.again, default=math.inf)


async def next_change(stream: BrowserStream, again_at: float) -> bool:
    """Sleep until the stream is woken (then a little longer, for the rest of a burst of
    commits), the safety interval passed, or a poll's `again_at`; whether it was one of
    the first two (something may have changed) rather than the last."""
    if os.environ.get("CREW_WEB_LIVE") == "poll":
        await anyio.sleep(POLL_SECONDS)  # the loop before push, for the bench only
        return True
    safety = SAFETY_SECONDS
    timeout = min(safety, max(0.0, again_at - time.monotonic()))
    with anyio.move_on_after(timeout):
        await stream.wake.wait()
    if stream.wake.is_set():
        await anyio.sleep(COALESCE_SECONDS)
        return True
    return timeout >= safety


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
    return every(STATUS_EVERY, lambda: changed.replace("roster", render()))


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
    return every(STATUS_EVERY, poll)


def turn(web: Web, session: Session, path: dict[str, str], after: int, last: int | None) -> Poll:
    """A running turn's events as they come, its summary as it changes; ends with the turn.

    A tool call shows while it runs (its `tool_start`); its `tool_use` replaces that
    element in place (`outer`, with the `tool_use`'s index as the update's id, so a
    reconnect goes on after it), as the page lists it on a load (`folded_events`).
    """
    turn_id = path["turn_id"]
    start = web.store.get_turn(turn_id)
    # The page shows the events before `from` (`after` here); the tab has up to `last`.
    next_index = after if last is None else max(after, last + 1)
    # The cost of a running turn is summed from its steps: keep them all.
    steps = [e for e in start["events"] if e["type"] == "step_finish"]
    # The calls the tab shows as running: started before `next_index`, not finished there.
    running = open_starts([e for e in start["events"] if e["index"] < next_index])
    changed = Changed()
    changed.replace("turn-summary", fragment("_turn_summary.html", summary_context(start, steps)))

    def poll() -> list[Update]:
        nonlocal next_index
        shown = web.store.get_turn(turn_id, next_index)
        new = shown["events"]
        updates = [event_update(e, running) for e in new]
        if new:
            next_index = new[-1]["index"] + 1
            steps.extend(e for e in new if e["type"] == "step_finish")
        summary = fragment("_turn_summary.html", summary_context(shown, steps))
        updates += changed.replace("turn-summary", summary)
        if shown["status"] != "running" and not new:
            updates += [unfinished_update(e) for e in running.values()]
            running.clear()
            updates.append(Update("turn-events", "end"))
        return updates

    return poll


def event_update(event: dict[str, Any], running: dict[str, dict[str, Any]]) -> Update:
    """A new event of a turn on its page: appended, or (a tool call that finished) in
    place of its running start. `running` (call id → start) follows what the tab shows."""
    html = fragment("_turn_event.html", {"event": event})
    call_id = call_id_of(event)
    if call_id is not None and event["type"] == "tool_use" and call_id in running:
        started = running.pop(call_id)
        return Update(f"e-{started['index']}", "outer", html, event["index"])
    if call_id is not None and event["type"] == "tool_start":
        running[call_id] = event
    return Update("turn-events", "append", html, event["index"])


def unfinished_update(started: dict[str, Any]) -> Update:
    """A call still shown running when its turn ended: it did not finish (a stop, a limit)."""
    html = fragment("_turn_event.html", {"event": {**started, "unfinished": True}})
    return Update(f"e-{started['index']}", "outer", html)


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
