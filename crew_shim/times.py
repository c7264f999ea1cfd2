"""Times and periods as agents write them, read in the machine's time zone.

Everything here is pure: the clock (`now`, aware) and the zone (`tz`) are
arguments, so tests fix both. Only `local_zone()` looks at the machine; it
reads `/etc/localtime`, never the environment (the shim reads nothing else
from it but its two variables).
"""

from __future__ import annotations

import os
import re
from datetime import UTC, date, datetime, timedelta, tzinfo

from crew_shim.errors import InputError

MIN_PERIOD = timedelta(minutes=15)
MIN_MUTE = timedelta(minutes=15)
MAX_MUTE = timedelta(days=7)
MAX_AHEAD = timedelta(days=366)

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_FULL_WEEKDAYS = {
    f"{day}day": day[:3] for day in ("mon", "tues", "wednes", "thurs", "fri", "satur", "sun")
}

_DURATION_PART = re.compile(r"(\d+)\s*(w|d|h|m|min|mins)(?![a-z])")
_UNIT_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "min": 60, "mins": 60}
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})")
_LOCAL_DATE_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{1,2}):(\d{2})(?::(\d{2}))?")
_LOCALTIME = "/etc/localtime"


def parse_duration(text: str, *, option: str) -> timedelta:
    """Read `10m`, `2h`, `1h30m`, `3d`, `1w` (units w, d, h, m) as a timedelta.

    `option` names the flag in the error message (e.g. `--in`).
    """
    compact = text.strip().lower()
    pos = 0
    total = 0
    for match in _DURATION_PART.finditer(compact):
        if compact[pos : match.start()].strip():
            break
        total += int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos == 0 or compact[pos:].strip() or total <= 0:
        raise InputError(
            f'"{text}" is not a duration for {option}. '
            "Write a number and a unit, like 10m, 2h, 1h30m or 3d."
        )
    return timedelta(seconds=total)


def parse_clock(text: str, *, option: str) -> str:
    """Read a wall-clock time `9:00` / `09:00` and return it as `HH:MM`."""
    match = _CLOCK.fullmatch(text.strip())
    if match is None or int(match.group(1)) > 23 or int(match.group(2)) > 59:
        raise InputError(
            f'"{text}" is not a time of day for {option}. Write it as HH:MM, like 09:00 or 18:30.'
        )
    return f"{int(match.group(1)):02d}:{match.group(2)}"


def parse_weekday(text: str) -> str:
    """Read a day name (`mon`, `Monday`, …) and return its three-letter form."""
    word = text.strip().lower()
    short = _FULL_WEEKDAYS.get(word, word)
    if short not in WEEKDAYS:
        raise InputError(
            f'"{text}" is not a day of the week for --weekly. '
            "Write mon, tue, wed, thu, fri, sat or sun, like --weekly mon 09:00."
        )
    return short


def parse_at(text: str, *, now: datetime, tz: tzinfo) -> datetime:
    """Read the time of `--at` and return it as an aware datetime in the future.

    Accepted: `18:00` (the next 18:00 in `tz`, today or tomorrow),
    `2026-10-06 09:00` (a wall time in `tz`), and ISO 8601 with an offset
    (`2026-10-06T09:00:00+02:00`, `…Z`).
    """
    raw = text.strip()
    clock = _CLOCK.fullmatch(raw)
    if clock is not None:
        hhmm = parse_clock(raw, option="--at")
        hour, minute = int(hhmm[:2]), int(hhmm[3:])
        local_now = now.astimezone(tz)
        candidate = _wall_time(local_now.date(), hour, minute, tz)
        if candidate <= now:
            candidate = _wall_time(local_now.date() + timedelta(days=1), hour, minute, tz)
        return candidate
    when = _parse_date_time(raw, tz)
    if when <= now:
        raise InputError(
            f"{format_local(when, tz)} has already passed. "
            "Give a time in the future, like --at 18:00 or --in 2h."
        )
    if when - now > MAX_AHEAD:
        raise InputError(
            f"{format_local(when, tz)} is more than a year away. Give a time within the next year."
        )
    return when


def check_period(period: timedelta) -> timedelta:
    """Refuse a repeating period under 15 minutes (the server would refuse it too)."""
    if period < MIN_PERIOD:
        raise InputError(
            f"a reminder cannot repeat more often than every 15 minutes (asked: every "
            f"{format_period(period)}). Use --every 15m or longer."
        )
    return period


def check_delay(delay: timedelta) -> timedelta:
    """Refuse an `--in` delay under a minute or over a year."""
    if delay < timedelta(minutes=1):
        raise InputError("--in must be at least 1 minute. Use --in 1m or longer.")
    if delay > MAX_AHEAD:
        raise InputError("--in must be at most a year. Use a shorter delay.")
    return delay


def check_mute(duration: timedelta) -> timedelta:
    """A timed mute lasts from 15 minutes to 7 days."""
    if not MIN_MUTE <= duration <= MAX_MUTE:
        raise InputError(
            f"a mute lasts from 15 minutes to 7 days (asked: {format_period(duration)}). "
            "Use --for between 15m and 7d, or leave --for out to mute until you unmute."
        )
    return duration


def format_local(when: datetime, tz: tzinfo) -> str:
    """`Tue 2026-10-06 18:00 +08:00`: the wall time in `tz` with its UTC offset."""
    local = when.astimezone(tz)
    return f"{local:%a %Y-%m-%d %H:%M} {utc_offset(local)}"


def utc_offset(when: datetime) -> str:
    """`+08:00`, `-03:30`, `+00:00` for an aware datetime."""
    offset = when.utcoffset() or timedelta(0)
    minutes = int(offset.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    hours, mins = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}:{mins:02d}"


def format_period(period: timedelta) -> str:
    """`2h`, `1h30m`, `3d`, `45s` — the shortest way to write a period."""
    seconds = int(period.total_seconds())
    if seconds <= 0:
        return f"{seconds}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    if seconds:
        parts.append(f"{seconds}s")
    return "".join(parts)


def parse_rfc3339(text: str) -> datetime:
    """Parse a server time (RFC 3339 with offset or `Z`) as an aware datetime."""
    when = datetime.fromisoformat(text)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def local_zone() -> tuple[tzinfo, str]:
    """The machine's time zone and the name to send to the server.

    The name is the IANA name behind `/etc/localtime` when it has one (so a
    daily reminder follows daylight saving), else the current `+HH:MM` offset.
    """
    try:
        target = os.readlink(_LOCALTIME)
    except OSError:
        target = ""
    name = target.partition("zoneinfo/")[2]
    if name:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            return ZoneInfo(name), name
        except (ZoneInfoNotFoundError, ValueError):
            pass  # a link into an unusual tree: fall back to the fixed offset below
    zone = datetime.now().astimezone().tzinfo or UTC
    return zone, utc_offset(datetime.now(zone))


def _wall_time(day: date, hour: int, minute: int, tz: tzinfo) -> datetime:
    """A wall time in `tz`, normalised so a time in a DST gap gets its real offset."""
    naive = datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz)
    return naive.astimezone(UTC).astimezone(tz)


def _parse_date_time(raw: str, tz: tzinfo) -> datetime:
    local = _LOCAL_DATE_TIME.fullmatch(raw)
    if local is not None:
        year, month, day, hour, minute = (int(local.group(i)) for i in range(1, 6))
        try:
            return _wall_time(date(year, month, day), hour, minute, tz).replace(
                second=int(local.group(6) or 0)
            )
        except ValueError:
            pass  # e.g. 2026-02-30: reported below with the accepted forms
    else:
        try:
            parsed = datetime.fromisoformat(raw)
        except ValueError:
            parsed = None
        if parsed is not None and parsed.tzinfo is not None:
            return parsed
    raise InputError(
        f'"{raw}" is not a time for --at. '
        "Write 18:00, 2026-10-06 09:00, or ISO 8601 with an offset like 2026-10-06T09:00+02:00."
    )
