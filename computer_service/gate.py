"""`TurnGate`: the cap on concurrent turns of one Computer (`max_concurrent_turns`).

Runners queue for a slot in arrival order; a stopped runner leaves the queue at
once (`abort`). A freed slot goes straight to the next in line.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio


class TurnGate:
    """At most `capacity` turns at once; the others wait in FIFO order (`queued`)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.running = 0
        self.peak = 0
        self._waiters: deque[anyio.Event] = deque()

    @property
    def queued(self) -> int:
        """How many turns wait for a slot."""
        return len(self._waiters)

    @asynccontextmanager
    async def slot(self, abort: anyio.Event | None = None) -> AsyncIterator[bool]:
        """Hold one slot for the body (True); wait in line when all are taken.

        When `abort` is set while waiting, leave the line at once: the body
        runs with False and no slot (a stopped turn does not wait its turn).
        """
        held = await self._acquire(abort)
        try:
            yield held
        finally:
            if held:
                self._release()

    async def _acquire(self, abort: anyio.Event | None) -> bool:
        if self.running < self.capacity and not self._waiters:
            self._take()
            return True
        if abort is not None and abort.is_set():
            return False
        granted = anyio.Event()
        self._waiters.append(granted)
        try:
            if abort is None:
                await granted.wait()
            else:
                async with anyio.create_task_group() as waiting:

                    async def give_up() -> None:
                        await abort.wait()
                        waiting.cancel_scope.cancel()

                    waiting.start_soon(give_up)
                    await granted.wait()
                    waiting.cancel_scope.cancel()
        except BaseException:
            # Cancelled in line: leave the line, or pass on a slot handed over meanwhile.
            if granted.is_set():
                self._release()
            else:
                self._waiters.remove(granted)
            raise
        if granted.is_set():
            return True
        self._waiters.remove(granted)
        return False

    def _take(self) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)

    def _release(self) -> None:
        if self._waiters:
            # Hand the slot straight to the next in line: `running` stays the same.
            self._waiters.popleft().set()
        else:
            self.running -= 1
