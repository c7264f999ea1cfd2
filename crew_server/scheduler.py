"""Firing reminders: the scheduler sleeps until the next reminder is due, or until poked.

It also expires approvals nobody answered in time (issue 24), waking at the next one's
`expires_at`, so a card says "Expired" and the Computer's wait ends without a read."""

from __future__ import annotations

import asyncio
import logging

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
            delay = 60.0
            try:
                following = self.store.next_reminder_at()
            except Exception:
                log.exception("reading the next reminder time failed; will retry")
                following = None
            try:
                expiry = self.store.next_approval_expiry()
            except Exception:
                log.exception("reading the next approval expiry failed; will retry")
                expiry = None
            for moment in (following, expiry):
                if moment is not None:
                    delay = min(delay, max(0.0, (moment - self.clock.now()).total_seconds()))
            with anyio.move_on_after(delay):
                await self._poke.wait()
