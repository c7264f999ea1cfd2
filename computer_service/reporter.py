"""`RunReporter`: a turn's engine events, reported upstream in order (computer.md §2.3).

Events that arrive while a batch is in flight form the next batch, so batches
never overlap and never reorder; `first_index` numbers them from 0 per turn.
While the crew server cannot be reached (down, restarting: `UpstreamUnavailable`)
the events wait, in memory, and go out in order once it answers again; the
turn goes on meanwhile. The bound of what waits is `MAX_KEPT_EVENTS` events and
`MAX_KEPT_BYTES` bytes (no spool to disk): past it the oldest are dropped, their
indexes stay used, and the server records them as a gap when the next batch
arrives (issue 20). A batch the server refuses (4xx) is dropped the same way.
Closing the reporter flushes what is left, waiting up to `flush_window_s` for
the server (`abandon()` stops the wait: the Computer is stopping); `event_count`
then says how many events there were, so the finish can tell the server about a
lost tail.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import anyio
import orjson
from anyio.abc import TaskGroup

from computer_service.engine.base import EngineEvent
from computer_service.metrics import Metrics
from computer_service.upstream import StaleTurn, Superseded, UpstreamError, UpstreamUnavailable

log = logging.getLogger(__name__)

BatchSender = Callable[[int, list[dict[str, Any]]], Awaitable[None]]

# One request carries at most this many events and bytes (the server refuses
# bodies over 1 MiB); a flood is split, still in order.
MAX_BATCH_EVENTS = 2000
MAX_BATCH_BYTES = 512 * 1024
# What may wait for a server that cannot be reached (the oldest go first past it).
MAX_KEPT_EVENTS = 20_000
MAX_KEPT_BYTES = 32 * 1024 * 1024
# How long the rest of a turn's events may wait for the server once the turn is over.
FLUSH_WINDOW_S = 60.0
# Between tries while the server cannot be reached: from the first, doubling to the last.
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 2.0


class RunReporter:
    """Ordered, non-overlapping batches of one turn's events. Use as `async with`."""

    def __init__(
        self,
        send: BatchSender,
        metrics: Metrics,
        on_stale: Callable[[], None] = lambda: None,
        on_superseded: Callable[[], None] = lambda: None,
        *,
        flush_window_s: float = FLUSH_WINDOW_S,
        max_kept_events: int = MAX_KEPT_EVENTS,
        max_kept_bytes: int = MAX_KEPT_BYTES,
    ) -> None:
        self._send = send
        self._metrics = metrics
        self._on_stale = on_stale
        self._on_superseded = on_superseded
        self._flush_window_s = flush_window_s
        self._max_events = max_kept_events
        self._max_bytes = max_kept_bytes
        # The events not sent yet; the first of them has index `_next_index`.
        self._pending: list[dict[str, Any]] = []
        self._sizes: list[int] = []  # encoded size of each pending event
        self._pending_bytes = 0
        self._ready = anyio.Event()
        self._abandoned = anyio.Event()
        self._closed = False
        self._flush_deadline = 0.0
        self._stale = False
        self._in_flight = False
        self._next_index = 0
        self._task_group: TaskGroup | None = None
        self.batches_sent = 0
        self.batches_dropped = 0
        # Events that never reached the server (the server records them as gaps).
        self.events_lost = 0
        # Every event the turn produced, sent or dropped: the finish tells the server.
        self.event_count = 0

    async def __aenter__(self) -> RunReporter:
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._sender)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        # Flush: the sender drains what is pending (waiting a while for the server), then returns.
        self._closed = True
        self._flush_deadline = time.monotonic() + self._flush_window_s
        self._ready.set()
        assert self._task_group is not None
        return await self._task_group.__aexit__(exc_type, exc, tb)

    async def report(self, event: EngineEvent) -> None:
        """Queue one event; it goes out with the next batch (an `EventSink`)."""
        body = event.as_upstream()
        size = len(orjson.dumps(body))
        self._pending.append(body)
        self._sizes.append(size)
        self._pending_bytes += size
        self.event_count += 1
        self._metrics.events_reported += 1
        if not self._in_flight:
            # (During a send the batch in flight may come back to the front: trimmed then.)
            self._trim()
        if not self._ready.is_set():
            self._ready.set()

    def abandon(self) -> None:
        """Stop waiting for the server: what cannot go out now is dropped (a stop)."""
        self._abandoned.set()
        self._ready.set()

    @property
    def stale(self) -> bool:
        """True once the server answered `stale_turn` or `superseded`: nothing more is sent."""
        return self._stale

    async def _sender(self) -> None:
        delay = RETRY_FIRST_S
        while True:
            if not self._pending:
                if self._closed:
                    return
                await self._ready.wait()
                self._ready = anyio.Event()
                continue
            count = _batch_length(self._sizes)
            batch, sizes = self._pending[:count], self._sizes[:count]
            del self._pending[:count]
            del self._sizes[:count]
            self._pending_bytes -= sum(sizes)
            first_index = self._next_index
            self._next_index += len(batch)
            self._in_flight = True
            try:
                sent = await self._send_batch(first_index, batch)
            finally:
                self._in_flight = False
            if sent:
                self._trim()
                delay = RETRY_FIRST_S
                continue
            # The server cannot be reached: the batch waits at the front, in order.
            self._pending[:0] = batch
            self._sizes[:0] = sizes
            self._pending_bytes += sum(sizes)
            self._next_index = first_index
            self._trim()
            if self._abandoned.is_set() or (
                self._closed and time.monotonic() >= self._flush_deadline
            ):
                self._drop_pending("the crew server could not be reached in time")
                continue
            with anyio.move_on_after(delay):
                await self._abandoned.wait()
            delay = min(delay * 2, RETRY_MAX_S)

    async def _send_batch(self, first_index: int, batch: list[dict[str, Any]]) -> bool:
        """Send one batch; False when it should be sent again later (the server is away)."""
        if self._stale:
            self._dropped(len(batch))
            return True
        try:
            await self._send(first_index, batch)
        except StaleTurn:
            log.warning("turn events refused as stale: another Computer owns this agent now")
            self._stale = True
            self._dropped(len(batch))
            self._on_stale()
        except Superseded:
            log.warning("turn events refused: another Computer connected with this token")
            self._stale = True
            self._dropped(len(batch))
            self._on_superseded()
        except UpstreamUnavailable as exc:
            log.info(
                "%d turn events from index %d wait for the crew server: %s",
                len(batch),
                first_index,
                exc,
            )
            return False
        except UpstreamError as exc:
            log.warning(
                "dropped %d turn events from index %d: %s (the turn goes on)",
                len(batch),
                first_index,
                exc,
            )
            self._dropped(len(batch))
        else:
            self.batches_sent += 1
            self._metrics.batches_sent += 1
        return True

    def _trim(self) -> None:
        """Past the bound, the oldest waiting events are dropped (their indexes stay used)."""
        lost = 0
        while len(self._pending) > 1 and (
            len(self._pending) > self._max_events or self._pending_bytes > self._max_bytes
        ):
            self._pending.pop(0)
            self._pending_bytes -= self._sizes.pop(0)
            self._next_index += 1
            lost += 1
        if lost:
            log.warning(
                "dropped the %d oldest turn events waiting for the crew server (over the bound "
                "of %d events, %d bytes); the server records them as a gap",
                lost,
                self._max_events,
                self._max_bytes,
            )
            self.events_lost += lost
            self._dropped(0)

    def _drop_pending(self, why: str) -> None:
        count = len(self._pending)
        log.warning("dropped the last %d turn events: %s", count, why)
        self._next_index += count
        self._pending.clear()
        self._sizes.clear()
        self._pending_bytes = 0
        self._dropped(count)

    def _dropped(self, events: int) -> None:
        self.events_lost += events
        self.batches_dropped += 1
        self._metrics.batches_dropped += 1


def _batch_length(sizes: list[int]) -> int:
    """How many of the pending events fit one request (always at least one)."""
    total = 0
    for count, size in enumerate(sizes[:MAX_BATCH_EVENTS]):
        total += size
        if total > MAX_BATCH_BYTES and count > 0:
            return count
    return min(len(sizes), MAX_BATCH_EVENTS)
