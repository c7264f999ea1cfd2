"""The Computer's own event stream for `GET /events`: numbered, replayable, never silently lossy.

Every event the runners publish gets an id `<stream>-<n>` (`stream` is fixed
for this Computer process, `n` counts from 1) and goes into a ring of the last
`RING_SIZE` events. A reader is a cursor into the ring, not a queue: it sends
what lies after its cursor, so a reconnect with `Last-Event-ID` replays what it
missed, and a reader that falls more than a ring behind (a slow reader, or an
id older than the ring) gets a `missed` event with the count before it goes on.
Publishing never waits for a reader.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import anyio
import orjson

# How many events a reconnecting or slow reader can catch up on.
RING_SIZE = 1024
SSE_PING_S = 15.0


@dataclass(frozen=True)
class BusEvent:
    """One published event: its number in this stream, its SSE name and its data."""

    n: int
    kind: str
    data: dict[str, Any]


class BadEventId(ValueError):
    """A `Last-Event-ID` that is not an id of the form this stream sends."""


class EventBus:
    """Fan-out of runner state changes and engine events to `/events` readers."""

    def __init__(self, ring_size: int = RING_SIZE, stream: str | None = None) -> None:
        # Distinguishes this process's ids from a previous Computer's after a restart.
        self.stream = stream or format(time.time_ns() // 1_000_000, "x")
        self._ring: deque[BusEvent] = deque(maxlen=ring_size)
        self._last = 0
        self._published = anyio.Event()
        self._closed = False
        self.readers = 0
        # Events readers were told they missed (the ring had moved past them).
        self.missed_total = 0

    @property
    def has_subscribers(self) -> bool:
        """True while some `/events` reader listens."""
        return self.readers > 0

    @property
    def closed(self) -> bool:
        """True once the bus was closed (the service is stopping)."""
        return self._closed

    @property
    def last_id(self) -> str:
        """The id of the newest event (`<stream>-0` before the first)."""
        return f"{self.stream}-{self._last}"

    def publish(self, kind: str, data: dict[str, Any]) -> None:
        """Number one event and keep it in the ring; wakes every reader without waiting."""
        if self._closed:
            return
        self._last += 1
        self._ring.append(BusEvent(self._last, kind, data))
        self._published.set()
        self._published = anyio.Event()

    def close(self) -> None:
        """End every `/events` stream (at shutdown)."""
        self._closed = True
        self._published.set()

    def cursor_for(self, last_event_id: str | None) -> tuple[int, dict[str, Any] | None]:
        """Where a reader starts, and the `missed` notice it gets first (None: nothing missed).

        No id: live from now. An id of this stream: right after it. An id of
        another stream (the Computer restarted): from the oldest event kept,
        after a notice that earlier events are gone. Raises `BadEventId`.
        """
        if last_event_id is None:
            return self._last, None
        stream, sep, number = last_event_id.strip().rpartition("-")
        if not sep or not stream or not number.isdigit() or len(number) > 18:
            raise BadEventId(
                f"Last-Event-ID {last_event_id[:60]!r} is not an id of this stream "
                "(`<stream>-<n>`, as sent in `id:`); reconnect without it to follow live"
            )
        if stream != self.stream:
            oldest = self._ring[0].n if self._ring else self._last + 1
            notice = {
                "count": None,
                "reason": "the Computer restarted since that id: its earlier events are gone",
            }
            return oldest - 1, notice
        return min(int(number), self._last), None

    async def follow(
        self, cursor: int, ping_s: float = SSE_PING_S
    ) -> AsyncGenerator[BusEvent | dict[str, Any] | None, None]:
        """The events after `cursor`, as they come: a `BusEvent`, a `missed` notice (a dict)
        when the ring moved past the reader, or None after `ping_s` without an event.
        Ends when the bus closes."""
        self.readers += 1
        try:
            while not self._closed:
                if cursor < self._last:
                    oldest = self._ring[0].n
                    if cursor < oldest - 1:
                        count = oldest - 1 - cursor
                        self.missed_total += count
                        cursor = oldest - 1
                        yield {
                            "count": count,
                            "reason": f"this reader fell more than {self._ring.maxlen} "
                            "events behind",
                        }
                        continue
                    event = self._ring[cursor - oldest + 1]
                    cursor = event.n
                    yield event
                    continue
                published = self._published
                with anyio.move_on_after(ping_s) as timer:
                    await published.wait()
                if timer.cancelled_caught:
                    yield None
        finally:
            self.readers -= 1

    def sse_id(self, event: BusEvent) -> str:
        """The SSE `id:` of one event."""
        return f"{self.stream}-{event.n}"


def sse_frame(kind: str, data: dict[str, Any], event_id: str | None = None) -> bytes:
    """One server-sent event: `id:` (when given), `event:`, one `data:` line of JSON."""
    head = b"id: " + event_id.encode() + b"\n" if event_id is not None else b""
    return head + b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
