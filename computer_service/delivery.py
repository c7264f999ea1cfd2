"""What a runner remembers between turns so no message is lost, repeated or stuck.

Pure bookkeeping, no I/O (docs/contracts.md "Delivery at the edges"):
- a failure of the environment (not logged in, rate limited, launcher or
  server unreachable, …) keeps the messages; the runner tries again by itself
  after 5 s, doubling up to 5 min — or at the provider's time when it named one
  (a rate limit's `Retry-After`);
- a failure that may be the messages' own (engine error, crash, output too
  large, refused reply) narrows the next claim to the oldest message; the
  third failure on the same message sets it aside, so newer ones flow again;
- a success, or nothing left to claim, forgets all of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from computer_service.engine.base import Failure
from computer_service.engine.failures import blames_content, blames_environment

RETRY_BASE_S = 5.0
RETRY_CAP_S = 300.0
SET_ASIDE_AFTER = 3
# A provider's Retry-After is taken as said, up to a day (a quota window).
RETRY_AFTER_CAP_S = 24 * 3600.0


@dataclass(frozen=True)
class NextStep:
    """What to do after a failed turn: set its claim aside, and when to try again (None: wait)."""

    retry_in_s: float | None
    set_aside: bool = False
    # The provider's own time (Retry-After): no turn before it, even when woken.
    firm: bool = False


class Retries:
    """The failures of one agent's recent turns, and what they mean for the next claim."""

    def __init__(
        self,
        base_s: float = RETRY_BASE_S,
        cap_s: float = RETRY_CAP_S,
        set_aside_after: int = SET_ASIDE_AFTER,
    ) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.set_aside_after = set_aside_after
        self.failures = 0  # in a row, of any retried kind: the backoff's exponent
        self.strikes = 0  # content failures in a row on the same oldest message
        self._suspects: frozenset[str] = frozenset()
        self.narrow = False

    @property
    def max_messages(self) -> int | None:
        """The claim's bound: only the oldest message while isolating a failing one."""
        return 1 if self.narrow else None

    def next_delay(self) -> float:
        """The backoff for one more failure in a row: base, doubling, capped."""
        delay = min(self.base_s * 2**self.failures, self.cap_s)
        self.failures += 1
        return delay

    def forget(self) -> None:
        """A turn succeeded (or there was nothing to claim): start from scratch."""
        self.failures = 0
        self.strikes = 0
        self._suspects = frozenset()
        self.narrow = False

    def failed(self, failure: Failure, claimed: frozenset[str]) -> NextStep:
        """A turn over the messages `claimed` (their ids) failed with `failure`."""
        if blames_environment(failure):
            delay = self.next_delay()
            if failure.retry_after_s is not None:
                # The provider named its time (a rate limit's Retry-After): not sooner, not later.
                delay = min(max(failure.retry_after_s, 0.0), RETRY_AFTER_CAP_S)
                return NextStep(delay, firm=True)
            return NextStep(delay)
        if not blames_content(failure):
            # Stopped by the user, or a session to renew: not retried by itself.
            return NextStep(None)
        if self.strikes and self._suspects & claimed:
            self.strikes += 1
            self._suspects &= claimed
        else:
            self.strikes = 1
            self._suspects = claimed
        if self.strikes >= self.set_aside_after and len(claimed) == 1:
            # The one message that failed every time: set aside, and newer ones flow at once.
            self.forget()
            return NextStep(0.0, set_aside=True)
        self.narrow = True
        return NextStep(self.next_delay())
