"""`RunReporter`: a turn's engine events, reported upstream in order (computer.md §2.3).

Events that arrive while a batch is in flight form the next batch, so batches
never overlap and never reorder; `first_index` numbers them from 0 per turn.
A failed batch is logged and dropped (its indexes stay used: the server sees
the gap) and the turn goes on. Closing the reporter flushes what is left;
`event_count` then says how many events there were, so the finish can tell
the server about a lost tail.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import anyio
import orjson
from anyio.abc import TaskGroup

from computer_service.engine.base import EngineEvent
from computer_service.metrics import Metrics
from computer_service.upstream import StaleTurn, Superseded, UpstreamError

log = logging.getLogger(__name__)

BatchSender = Callable[[int, list[dict[str, Any]]], Awaitable[None]]

# One request carries at most this many events and bytes (the server refuses
# bodies over 1 MiB); a flood is split, still in order.
MAX_BATCH_EVENTS = 2000
MAX_BATCH_BYTES = 512 * 1024


class RunReporter:
    """Ordered, non-overlapping batches of one turn's events. Use as `async with`."""

    def __init__(
        self,
        send: BatchSender,
        metrics: Metrics,
        on_stale: Callable[[], None] = lambda: None,
        on_superseded: Callable[[], None] = lambda: None,
    ) -> None:
        self._send = send
        self._metrics = metrics
        self._on_stale = on_stale
        self._on_superseded = on_superseded
        self._pending: list[dict[str, Any]] = []
        self._sizes: list[int] = []  # encoded size of each pending event
        self._ready = anyio.Event()
        self._closed = False
        self._stale = False
        self._next_index = 0
        self._task_group: TaskGroup | None = None
        self.batches_sent = 0
        self.batches_dropped = 0
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
        # Flush: the sender drains what is pending, then returns.
        self._closed = True
        self._ready.set()
        assert self._task_group is not None
        return await self._task_group.__aexit__(exc_type, exc, tb)

    async def report(self, event: EngineEvent) -> None:
        """Queue one event; it goes out with the next batch (an `EventSink`)."""
        body = event.as_upstream()
        self._pending.append(body)
        self._sizes.append(len(orjson.dumps(body)))
        self.event_count += 1
        self._metrics.events_reported += 1
        if not self._ready.is_set():
            self._ready.set()

    @property
    def stale(self) -> bool:
        """True once the server answered `stale_turn` or `superseded`: nothing more is sent."""
        return self._stale

    async def _sender(self) -> None:
        while True:
            if not self._pending:
                if self._closed:
                    return
                await self._ready.wait()
                self._ready = anyio.Event()
                continue
            count = _batch_length(self._sizes)
            batch = self._pending[:count]
            del self._pending[:count]
            del self._sizes[:count]
            first_index = self._next_index
            self._next_index += len(batch)
            await self._send_batch(first_index, batch)

    async def _send_batch(self, first_index: int, batch: list[dict[str, Any]]) -> None:
        if self._stale:
            self._dropped()
            return
        try:
            await self._send(first_index, batch)
        except StaleTurn:
            log.warning("turn events refused as stale: another Computer owns this agent now")
            self._stale = True
            self._dropped()
            self._on_stale()
        except Superseded:
            log.warning("turn events refused: another Computer connected with this token")
            self._stale = True
            self._dropped()
            self._on_superseded()
        except UpstreamError as exc:
            log.warning(
                "dropped %d turn events from index %d: %s (the turn goes on)",
                len(batch),
                first_index,
                exc,
            )
            self._dropped()
        else:
            self.batches_sent += 1
            self._metrics.batches_sent += 1

    def _dropped(self) -> None:
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
