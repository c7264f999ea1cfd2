"""The open live streams: one per browser, each with the topics its tabs subscribed to
(see `live.py` for the protocol). In memory, like the sessions they belong to.

A stream sleeps until it is woken (`BrowserStream.wake`): by the store after a commit
that changed something (`BrowserStreams.changed`, the store's `changed_listener`), by
a new subscription (its first look), by its own end, or by the server stopping.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from crew_server.errors import Invalid, NotFound
from crew_server.web.session import Session

# Bounds on what one session can make the server poll: a browser has one stream (one
# per tab without SharedWorker), a tab a few topics; the oldest goes first.
STREAMS_PER_SESSION = 16
TOPICS_PER_STREAM = 64
CLIENT_IDS_KEPT = 1_000
CLIENT_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")


@dataclass(frozen=True)
class Update:
    """One change to a page: new content for (or after the end of) an element."""

    target: str
    mode: str  # "append" | "replace" (the inside) | "outer" (the element) | "end"
    html: str = ""
    event_id: int | None = None


Poll = Callable[[], list[Update]]


@dataclass
class BrowserStream:
    """One browser's open stream and what its tabs subscribed to (key → poll)."""

    stream_id: str
    session: Session
    polls: OrderedDict[str, Poll] = field(default_factory=OrderedDict)
    closed: bool = False
    # Set when the stream should look at its subscriptions again.
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def subscribe(self, key: str, poll: Poll) -> None:
        self.polls.pop(key, None)
        self.polls[key] = poll
        while len(self.polls) > TOPICS_PER_STREAM:
            self.polls.popitem(last=False)
        # What came between the page's rendering and now goes out at once.
        self.wake.set()


class BrowserStreams:
    """The open streams of every session (in memory, like the sessions)."""

    def __init__(self) -> None:
        self._streams: OrderedDict[str, BrowserStream] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self, session: Session) -> BrowserStream:
        self._loop = asyncio.get_running_loop()
        stream = BrowserStream(secrets.token_urlsafe(16), session)
        self._streams[stream.stream_id] = stream
        mine = [s for s in self._streams.values() if s.session.session_id == session.session_id]
        for old in mine[: max(0, len(mine) - STREAMS_PER_SESSION)]:
            self.close(old)
        return stream

    def close(self, stream: BrowserStream) -> None:
        stream.closed = True
        stream.wake.set()
        self._streams.pop(stream.stream_id, None)

    def changed(self) -> None:
        """Wake every open stream: the store changed (or a session ended). Called after
        commits, maybe from another thread."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._wake_all()
        else:
            loop.call_soon_threadsafe(self._wake_all)

    def stopping(self) -> None:
        """The server stops (called from a signal handler): every stream ends soon."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        for stream in self._streams.values():
            stream.wake.set()

    def of(self, session: Session, stream_id: str) -> BrowserStream:
        """The session's stream `stream_id`; NotFound (the stream ended: a new one will
        say hello) otherwise."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.session.session_id != session.session_id:
            raise NotFound("that live stream has ended; the page reconnects by itself")
        return stream


class ClientIds:
    """The page's own ids of the messages it posted, which it shows as pending until the
    stream brings them: the fragment carries the id back (`data-client-id`) so the page
    replaces its pending copy. The newest few only, in memory, for the whole process
    (message ids are UUIDs): a message rendered without one (another server process, an
    old message) is matched by the message id the post answered."""

    def __init__(self) -> None:
        self._ids: OrderedDict[str, str] = OrderedDict()

    @staticmethod
    def checked(client_id: str) -> str:
        """A posted `client_id` field ("" when none); `Invalid` when it is not an id."""
        if client_id and not CLIENT_ID.fullmatch(client_id):
            raise Invalid("client_id must be 1 to 40 letters, digits, - or _")
        return client_id

    def remember(self, message_id: str, client_id: str) -> None:
        self._ids[message_id] = self.checked(client_id)
        while len(self._ids) > CLIENT_IDS_KEPT:
            self._ids.popitem(last=False)

    def of(self, message_id: str) -> str:
        """The client id a page gave when it posted `message_id` ("" when none)."""
        return self._ids.get(message_id, "")


CLIENT_IDS = ClientIds()
