"""The server's clock: real time plus an offset that tests and `--dev` can move.

Everything time-dependent (mutes, reminders, turn records) reads `Clock.now()`,
so a test can freeze time or jump ahead without sleeping.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class Clock:
    """Wall-clock time, optionally frozen at `start`, moved forward by `advance`."""

    def __init__(self, start: datetime | None = None) -> None:
        if start is not None and start.tzinfo is None:
            raise ValueError("Clock start must be timezone-aware")
        self._frozen = start.astimezone(UTC) if start is not None else None
        self._offset = timedelta(0)

    def now(self) -> datetime:
        """The current time in UTC."""
        base = self._frozen if self._frozen is not None else datetime.now(UTC)
        return base + self._offset

    def advance(self, seconds: float) -> datetime:
        """Move the clock forward by `seconds` and return the new time."""
        if seconds < 0:
            raise ValueError("the clock only moves forward")
        offset = self._offset + timedelta(seconds=seconds)
        base = self._frozen if self._frozen is not None else datetime.now(UTC)
        if (base + offset).year > 9000:  # OverflowError past 9999; stored times stay 4-digit
            raise ValueError("the clock cannot move past the year 9000")
        self._offset = offset
        return self.now()


def iso(moment: datetime) -> str:
    """RFC 3339 in UTC, fixed width (always microseconds), so text order is time order."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")


def parse_iso(text: str) -> datetime:
    """Parse an RFC 3339 time with an offset; raise ValueError when it has none."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError(f"time {text!r} has no UTC offset")
    return moment.astimezone(UTC)
