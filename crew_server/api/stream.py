"""The Computer's event stream (SSE): the hub that wakes open streams, replay, pings.

A Computer holds `GET /computer/events` open. The store tells the hub which
Computers got new events after each commit; the hub wakes their streams, which
read the events after their cursor. A stream idle for `ping_seconds` sends a
`ping`; `Last-Event-ID` resumes after what the Computer already saw.

`PrewarmHints` decides when a room's agents get a `prewarm` hint (issue 26).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import orjson
from starlette.responses import StreamingResponse

from crew_server.errors import Invalid
from crew_server.store import Store

if TYPE_CHECKING:
    from crew_server.api.http import Connection

PING_SECONDS = 15.0
# At most one prewarm hint per agent this often (a warm server idles 10 min on the Computer).
PREWARM_EVERY_S = 30.0


class EventHub:
    """Wakes the SSE streams of a Computer when the store committed events for it."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        # Called on close too (each safe from any thread): the web's live streams end.
        self.on_close: list[Callable[[], None]] = []

    def close(self) -> None:
        """The server is stopping: end every stream (they would hold the shutdown forever).

        Safe to call from a signal handler or another thread.
        """
        self.closed = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._set, set(self._waiting))
        for callback in self.on_close:
            callback()

    def subscribe(self, computer_id: str) -> asyncio.Event:
        """A flag set whenever this Computer gets new events."""
        self._loop = asyncio.get_running_loop()
        flag = asyncio.Event()
        self._waiting.setdefault(computer_id, set()).add(flag)
        return flag

    def unsubscribe(self, computer_id: str, flag: asyncio.Event) -> None:
        """Forget a stream's flag (the stream ended)."""
        flags = self._waiting.get(computer_id)
        if flags is not None:
            flags.discard(flag)
            if not flags:
                del self._waiting[computer_id]

    def listening(self) -> set[str]:
        """The Computers with an open event stream now (connected)."""
        return set(self._waiting)

    def notify(self, computer_ids: set[str]) -> None:
        """Called by the store after a commit, possibly from another thread."""
        loop = self._loop
        if loop is None:
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._set(computer_ids)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._set, computer_ids)

    def notify_all(self) -> None:
        """Wake every open stream (commits may have gone unheard); on the loop's thread."""
        self._set(set(self._waiting))

    def _set(self, computer_ids: set[str]) -> None:
        for computer_id in computer_ids:
            for flag in self._waiting.get(computer_id, ()):
                flag.set()


@dataclass
class PrewarmHints:
    """When a person opens or types in a room, its agents' Computers get `prewarm`.

    Rate limited per agent (`every_s`), in this process's memory: with several server
    processes (PostgreSQL) each may send one per agent per period, and a restart forgets
    them. Both only cost the Computer a look at a server it already has. On SQLite a
    Computer without an open stream gets none (nothing would hear it; a replay later is
    useless); on PostgreSQL its stream may be open on another process, so it is sent.
    """

    every_s: float = PREWARM_EVERY_S
    clock: Callable[[], float] = time.monotonic
    _last: dict[str, float] = field(default_factory=dict)

    def hint_room(self, store: Store, hub: EventHub, room_id: str) -> list[str]:
        """Send the room's due hints → the agent ids hinted (none: all hinted recently)."""
        now = self.clock()
        listening = hub.listening() if store.dialect == "sqlite" else None
        due: dict[str, list[str]] = {}
        for agent_id, computer_id in store.room_agents_on_computers(room_id):
            if listening is not None and computer_id not in listening:
                continue
            last = self._last.get(agent_id)
            if last is not None and now - last < self.every_s:
                continue
            due.setdefault(computer_id, []).append(agent_id)
        if not due:
            return []
        store.send_prewarm(due)
        hinted = [agent_id for agent_ids in due.values() for agent_id in agent_ids]
        for agent_id in hinted:
            self._last[agent_id] = now
        if len(self._last) > 10_000:
            # Bounded: forget the hints older than the period.
            self._last = {a: t for a, t in self._last.items() if now - t < self.every_s}
        return hinted


# Event ids are 64-bit integers in both databases.
MAX_EVENT_ID = 2**63 - 1


def event_id(header: str | None) -> int | None:
    """The id in a `Last-Event-ID` header; None when absent or empty. `Invalid` when it is
    not one this server could have sent (not a decimal integer, or beyond 64 bits)."""
    raw = (header or "").strip()
    if not raw:
        return None
    # Checked before int(): Python refuses to convert more than 4,300 digits (ValueError).
    if not (raw.isascii() and raw.isdigit() and len(raw) <= len(str(MAX_EVENT_ID))):
        raise Invalid(
            f"Last-Event-ID must be an id this server sent (an integer up to {MAX_EVENT_ID}), "
            f"not {raw[:40]!r}{'…' if len(raw) > 40 else ''}; reconnect without it to start afresh"
        )
    value = int(raw)
    if value > MAX_EVENT_ID:
        raise Invalid(
            f"Last-Event-ID {value} is beyond any id this server sends ({MAX_EVENT_ID}); "
            "reconnect without it to start afresh"
        )
    return value


def event_stream(
    store: Store,
    hub: EventHub,
    caller: Connection,
    last_event_id: str | None,
    ping_seconds: float,
) -> StreamingResponse:
    """The open SSE answer for a Computer's connection, resuming after `last_event_id`.

    When a newer connection with the same token appears, the stream sends one
    `superseded` event (`{"epoch": <the new epoch>}`) and ends; when the Computer is
    deleted (its token revoked), one `revoked` event (`{"reason": …}`) and ends.
    """
    computer_id = caller.computer_id
    # An id from before a database reset would hide every new event: start afresh.
    # One older than the replay log: wake every agent of this Computer first.
    cursor, lost = store.replay_start(computer_id, event_id(last_event_id))
    flag = hub.subscribe(computer_id)

    async def stream() -> AsyncIterator[bytes]:
        nonlocal cursor
        # A comment opens the stream at once (clients see the 200 without waiting for
        # an event); the reconnect delay rides on the first real event.
        retry = "retry: 2000\n"
        try:
            yield b": connected\n\n"
            if lost is not None:
                # The agent list may have changed too: `agents` (agent_id null) first.
                resync = [("agents", None), *(("wake", a) for a in lost)]
                for event, agent_id in resync:
                    data = orjson.dumps({"agent_id": agent_id}).decode()
                    yield f"{retry}id: {cursor}\nevent: {event}\ndata: {data}\n\n".encode()
                    retry = ""
            while not hub.closed:
                flag.clear()
                current = store.current_epoch(computer_id)
                if current != caller.epoch:
                    # A deleted Computer's epoch moves on too: it is told why, and ends.
                    revoked = store.computer_revoked(computer_id)
                    event, answer = (
                        ("revoked", {"reason": revoked})
                        if revoked is not None
                        else ("superseded", {"epoch": current})
                    )
                    data = orjson.dumps(answer).decode()
                    yield f"{retry}id: {cursor}\nevent: {event}\ndata: {data}\n\n".encode()
                    return
                rows = store.events_after(computer_id, cursor)
                for event_id, event, data in rows:
                    cursor = event_id
                    yield f"{retry}id: {event_id}\nevent: {event}\ndata: {data}\n\n".encode()
                    retry = ""
                if rows:
                    continue
                with anyio.move_on_after(ping_seconds) as waited:
                    await flag.wait()
                if waited.cancelled_caught:
                    yield f"{retry}id: {cursor}\nevent: ping\ndata: {{}}\n\n".encode()
                    retry = ""
        finally:
            hub.unsubscribe(computer_id, flag)

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
