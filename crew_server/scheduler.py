"""Firing reminders: the scheduler sleeps until the next reminder is due, or until poked.

It also ends budget holds (issue 24): an agent held by a reached cap is woken when its
period ends (the start of the next UTC day or month), so its waiting messages are answered;
and it expires approvals nobody answered in time, waking at the next one's `expires_at`, so
a card says "Expired" and the Computer's wait ends without a read.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

import anyio

from crew_server.clock import Clock
from crew_server.store import Store

log = logging.getLogger(__name__)


class ReminderScheduler:
    """Fires due reminders: sleeps until the next one is due, or until poked."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self._poke: asyncio.Event | None = None

    def poke(self) -> None:
        """Reminders changed (or the clock moved): look again now."""
        if self._poke is not None:
            self._poke.set()

    def run_due(self) -> int:
        """Fire what is due now; a failure is logged and retried on the next round."""
        self.expire_approvals()
        try:
            return self.store.fire_due_reminders()
        except Exception:
            log.exception("firing due reminders failed; will retry")
            return 0

    def release_due(self) -> int:
        """Wake the agents whose budget period ended; a failure is logged and retried."""
        try:
            return self.store.release_budget_holds()
        except Exception:
            log.exception("ending budget holds failed; will retry")
            return 0

    def next_due(self) -> datetime | None:
        """The next reminder, budget period end or approval expiry (None: none, or it could
        not be read)."""
        try:
            times = [
                self.store.next_reminder_at(),
                self.store.next_budget_release_at(),
                self.store.next_approval_expiry(),
            ]
        except Exception:
            log.exception("reading the next reminder time failed; will retry")
            return None
        known = [t for t in times if t is not None]
        return min(known) if known else None

    def expire_approvals(self) -> None:
        """Expire the approvals past their time; a failure is logged and retried."""
        try:
            self.store.expire_due_approvals()
        except Exception:
            log.exception("expiring approvals failed; will retry")

    async def run(self) -> None:
        """Fire due reminders until cancelled (the app's lifespan owns this task)."""
        self._poke = asyncio.Event()
        while True:
            self._poke.clear()
            self.run_due()
            self.release_due()
            delay = 60.0
            following = self.next_due()
            if following is not None:
                delay = min(delay, max(0.0, (following - self.clock.now()).total_seconds()))
            with anyio.move_on_after(delay):
                await self._poke.wait()
