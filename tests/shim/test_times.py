"""Time parsing of `crew remind` / `crew mute`, with a fixed clock and zone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from crew_shim.args import parse_args
from crew_shim.errors import InputError, UsageError
from crew_shim.reminders import WHEN_OPTIONS, build_request
from crew_shim.times import (
    check_delay,
    check_mute,
    check_period,
    format_local,
    format_period,
    parse_at,
    parse_clock,
    parse_duration,
    parse_weekday,
    utc_offset,
)

SHANGHAI = ZoneInfo("Asia/Shanghai")  # +08:00, no DST
BERLIN = ZoneInfo("Europe/Berlin")  # DST: 2026-03-29 02:00 → 03:00
# Tuesday 2026-10-06 17:30 in Shanghai.
NOW = datetime(2026, 10, 6, 9, 30, tzinfo=UTC)
ROOM = "0b6c1e2a-5d7f-4c1a-9e3b-2f8a6d4c7e10"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10m", 600),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("3d", 259200),
        ("1w", 604800),
        ("90min", 5400),
        ("45 mins", 2700),
        ("2H", 7200),
    ],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text, option="--in") == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["10", "m", "10x", "-5m", "0m", "", "1h30", "ten minutes", "5s"])
def test_bad_durations_name_the_option(text: str) -> None:
    with pytest.raises(InputError, match=r"not a duration for --every\. Write a number and a unit"):
        parse_duration(text, option="--every")


def test_at_clock_is_the_next_occurrence() -> None:
    # 17:30 local: 18:00 is today, 17:00 and 17:30 are tomorrow.
    assert parse_at("18:00", now=NOW, tz=SHANGHAI) == datetime(2026, 10, 6, 18, 0, tzinfo=SHANGHAI)
    assert parse_at("17:00", now=NOW, tz=SHANGHAI) == datetime(2026, 10, 7, 17, 0, tzinfo=SHANGHAI)
    assert parse_at("17:30", now=NOW, tz=SHANGHAI) == datetime(2026, 10, 7, 17, 30, tzinfo=SHANGHAI)
    assert parse_at("9:05", now=NOW, tz=SHANGHAI) == datetime(2026, 10, 7, 9, 5, tzinfo=SHANGHAI)


def test_at_local_date_time_and_iso_with_offset() -> None:
    local = parse_at("2026-10-07 09:00", now=NOW, tz=SHANGHAI)
    assert local.isoformat() == "2026-10-07T09:00:00+08:00"
    assert parse_at("2026-10-07T09:00", now=NOW, tz=SHANGHAI) == local
    iso = parse_at("2026-10-07T09:00:00+02:00", now=NOW, tz=SHANGHAI)
    assert iso == datetime(2026, 10, 7, 7, 0, tzinfo=UTC)
    assert parse_at("2026-10-07T07:00:00Z", now=NOW, tz=SHANGHAI) == iso


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2026-10-06 17:00", "Tue 2026-10-06 17:00 \\+08:00 has already passed"),
        ("2026-10-06T09:00:00+00:00", "Tue 2026-10-06 17:00 \\+08:00 has already passed"),
        ("2028-01-01 09:00", "more than a year away"),
        ("25:00", "not a time of day for --at"),
        ("tomorrow", "not a time for --at"),
        ("2026-02-30 09:00", "not a time for --at"),
        ("2026-10-07", "not a time for --at"),
    ],
)
def test_at_refusals(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_at(text, now=NOW, tz=SHANGHAI)


def test_at_follows_daylight_saving() -> None:
    # Saturday before the spring change: today +01:00, tomorrow +02:00.
    now = datetime(2026, 3, 28, 19, 0, tzinfo=UTC)  # 20:00 in Berlin
    tomorrow = parse_at("18:00", now=now, tz=BERLIN)
    assert tomorrow.isoformat() == "2026-03-29T18:00:00+02:00"
    # 02:30 does not exist that night: it is the same instant as 03:30 +02:00.
    gap = parse_at("02:30", now=now, tz=BERLIN)
    assert gap.isoformat() == "2026-03-29T03:30:00+02:00"
    assert format_local(gap, BERLIN) == "Sun 2026-03-29 03:30 +02:00"


def test_periods_and_mutes_are_bounded() -> None:
    assert check_period(timedelta(minutes=15)) == timedelta(minutes=15)
    with pytest.raises(InputError, match="more often than every 15 minutes \\(asked: every 14m\\)"):
        check_period(timedelta(minutes=14))
    assert check_mute(timedelta(minutes=15)) == timedelta(minutes=15)
    assert check_mute(timedelta(days=7)) == timedelta(days=7)
    for bad in (timedelta(minutes=14), timedelta(days=7, minutes=1)):
        with pytest.raises(InputError, match="from 15 minutes to 7 days"):
            check_mute(bad)
    with pytest.raises(InputError, match="at least 1 minute"):
        check_delay(timedelta(seconds=30))


def test_clock_weekday_and_formats() -> None:
    assert parse_clock("9:00", option="--daily") == "09:00"
    assert parse_clock("23:59", option="--daily") == "23:59"
    for bad in ("24:00", "9", "09:60", "9h"):
        with pytest.raises(InputError, match="not a time of day for --daily"):
            parse_clock(bad, option="--daily")
    assert parse_weekday("Monday") == "mon"
    assert parse_weekday("wed") == "wed"
    assert parse_weekday("Thursday") == "thu"
    for bad in ("funday", "mo", "monsoon"):
        with pytest.raises(InputError, match="not a day of the week"):
            parse_weekday(bad)
    assert format_period(timedelta(hours=1, minutes=30)) == "1h30m"
    assert format_period(timedelta(days=2)) == "2d"
    st_johns = datetime(2026, 1, 5, 12, 0, tzinfo=ZoneInfo("America/St_Johns"))
    assert utc_offset(st_johns) == "-03:30"
    assert format_local(NOW, SHANGHAI) == "Tue 2026-10-06 17:30 +08:00"


def _request(*argv: str) -> dict[str, object]:
    args = parse_args(argv, options=WHEN_OPTIONS, command="remind")
    return build_request(args, now=NOW, tz=SHANGHAI, tz_name="Asia/Shanghai")


def test_reminder_requests() -> None:
    base = {"room_id": ROOM, "title": "check the build", "tz": "Asia/Shanghai"}
    assert _request(ROOM, "check the build", "--in", "10m") == {
        **base,
        "at": "2026-10-06T17:40:00+08:00",
    }
    assert _request(ROOM, "check", "the", "build", "--at", "2026-10-07", "09:00") == {
        **base,
        "at": "2026-10-07T09:00:00+08:00",
    }
    assert _request(ROOM, "check the build", "--every", "2h") == {**base, "every": 7200}
    assert _request(ROOM, "check the build", "--daily", "9:00") == {**base, "daily": "09:00"}
    assert _request(ROOM, "check the build", "--weekly", "Monday", "09:00") == {
        **base,
        "weekly": {"day": "mon", "time": "09:00"},
    }
    assert _request(ROOM, "check the build", "--weekly=mon 09:00")["weekly"] == {
        "day": "mon",
        "time": "09:00",
    }


@pytest.mark.parametrize(
    ("argv", "error", "message"),
    [
        (
            (ROOM, "x", "--in", "1h", "--every", "2h"),
            UsageError,
            "exactly one of .*given: --in, --every",
        ),
        ((ROOM, "x"), UsageError, "exactly one of .*given: none"),
        ((ROOM, "--in", "1h"), InputError, "has no title"),
        (("not-a-room", "x", "--in", "1h"), InputError, "is not a room id"),
        ((ROOM, "x", "--every", "10m"), InputError, "every 15 minutes"),
        ((ROOM, "x", "--at", "16:61"), InputError, "not a time of day"),
        ((ROOM, "x" * 201, "--in", "1h"), InputError, "201 characters long; the limit is 200"),
    ],
)
def test_reminder_refusals(argv: tuple[str, ...], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        _request(*argv)
