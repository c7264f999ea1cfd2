"""The open live streams: one per browser, each with the topics its tabs subscribed to
(see `live.py` for the protocol). In memory, like the sessions they belong to."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from crew_server.errors import NotFound
from crew_server.web.session import Session

# Bounds on what one session can make the server poll: a browser has one stream (one
# per tab without SharedWorker), a tab a few topics; the oldest goes first.
STREAMS_PER_SESSION = 16
TOPICS_PER_STREAM = 64


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

    def subscribe(self, key: str, poll: Poll) -> None:
        self.polls.pop(key, None)
        self.polls[key] = poll
        while len(self.polls) > TOPICS_PER_STREAM:
            self.polls.popitem(last=False)


class BrowserStreams:
    """The open streams of every session (in memory, like the sessions)."""

    def __init__(self) -> None:
        self._streams: OrderedDict[str, BrowserStream] = OrderedDict()

    def open(self, session: Session) -> BrowserStream:
        stream = BrowserStream(secrets.token_urlsafe(16), session)
        self._streams[stream.stream_id] = stream
        mine = [s for s in self._streams.values() if s.session.session_id == session.session_id]
        for old in mine[: max(0, len(mine) - STREAMS_PER_SESSION)]:
            self.close(old)
        return stream

    def close(self, stream: BrowserStream) -> None:
        stream.closed = True
        self._streams.pop(stream.stream_id, None)

    def of(self, session: Session, stream_id: str) -> BrowserStream:
        """The session's stream `stream_id`; NotFound (the stream ended: a new one will
        say hello) otherwise."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.session.session_id != session.session_id:
            raise NotFound("that live stream has ended; the page reconnects by itself")
        return stream
