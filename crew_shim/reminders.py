"""`crew remind <room-id> <title> --in|--at|--every|--daily|--weekly`, `list`, `cancel`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from crew_shim.args import Args, expect_positionals, parse_args
from crew_shim.client import CrewServer, Effect
from crew_shim.common import Refusals, check_id, expect_success
from crew_shim.errors import InputError, UsageError
from crew_shim.times import (
    check_delay,
    check_period,
    format_local,
    format_period,
    parse_at,
    parse_clock,
    parse_duration,
    parse_rfc3339,
    parse_weekday,
)

MAX_TITLE = 200
WHEN_OPTIONS = {"in": 1, "at": 1, "every": 1, "daily": 1, "weekly": 2}

_EFFECT = Effect(
    unsent="changed",
    maybe=(
        "the change may have been made. Running the same command again is safe: "
        "the server does it once"
    ),
)


def run(argv: Sequence[str], *, stdout: Any) -> int:
    """Run `crew remind …`; return the exit code."""
    from crew_shim.help import REMIND_HELP

    first = argv[0] if argv else ""
    command = f"remind {first}" if first in ("list", "cancel") else "remind"
    rest = argv[1:] if first in ("list", "cancel") else argv
    args = parse_args(
        rest, options={} if first in ("list", "cancel") else WHEN_OPTIONS, command=command
    )
    if args.help:
        stdout.write(REMIND_HELP)
        return 0
    if first == "list":
        expect_positionals(args, [], command=command)
        return _list(stdout=stdout)
    if first == "cancel":
        return _cancel(args, stdout=stdout)
    from crew_shim.times import local_zone

    tz, tz_name = local_zone()
    request = build_request(args, now=datetime.now(UTC), tz=tz, tz_name=tz_name)
    room_id = request["room_id"]
    answer = CrewServer.from_environment().call("POST", "/agent/reminders", request, effect=_EFFECT)
    reminder = expect_success(
        answer,
        refusals=Refusals(
            forbidden=f"you are not a member of room {room_id}. Set reminders in rooms from your turn input.",
            not_found=f"there is no room {room_id}. Copy the room id from your turn input.",
        ),
        command="remind",
    )
    stdout.write(render_set(reminder, tz=tz))
    return 0


def build_request(args: Args, *, now: datetime, tz: tzinfo, tz_name: str) -> dict[str, Any]:
    """The reminder request from `crew remind <room-id> <title…> --<when> …`, checked locally."""
    if not args.positionals:
        raise UsageError(
            "crew remind needs a room id, a title and when (--in, --at, --every, --daily or "
            "--weekly). Run crew remind --help for examples."
        )
    room_id = check_id(args.positionals[0], what="room id")
    title = " ".join(word.strip() for word in args.positionals[1:]).strip()
    if not title:
        raise InputError(
            'the reminder has no title. Give one, like: crew remind <room-id> "check the build" --in 1h'
        )
    if len(title) > MAX_TITLE:
        raise InputError(
            f"the reminder title is {len(title)} characters long; the limit is {MAX_TITLE}. Shorten it."
        )
    given = [name for name in WHEN_OPTIONS if name in args.options]
    if len(given) != 1:
        said = ", ".join(f"--{name}" for name in given) if given else "none"
        raise UsageError(
            f"give exactly one of --in, --at, --every, --daily and --weekly (given: {said}). "
            "Run crew remind --help for examples."
        )
    request: dict[str, Any] = {"room_id": room_id, "title": title, "tz": tz_name}
    kind = given[0]
    values = args.options[kind]
    if kind == "in":
        delay = check_delay(parse_duration(values[0], option="--in"))
        request["at"] = _rfc3339((now + delay).astimezone(tz))
    elif kind == "at":
        request["at"] = _rfc3339(parse_at(values[0], now=now, tz=tz))
    elif kind == "every":
        request["every"] = int(
            check_period(parse_duration(values[0], option="--every")).total_seconds()
        )
    elif kind == "daily":
        request["daily"] = parse_clock(values[0], option="--daily")
    else:
        request["weekly"] = {
            "day": parse_weekday(values[0]),
            "time": parse_clock(values[1], option="--weekly"),
        }
    return request


def repeat_text(reminder: Mapping[str, Any]) -> str:
    """`every 2h`, `daily at 09:00`, `every mon at 09:00`, or "" for a one-off."""
    if reminder.get("every"):
        return f"every {format_period(timedelta(seconds=int(reminder['every'])))}"
    if reminder.get("daily"):
        return f"daily at {reminder['daily']}"
    weekly = reminder.get("weekly")
    if weekly:
        return f"every {weekly.get('day')} at {weekly.get('time')}"
    return ""


def render_set(reminder: Mapping[str, Any], *, tz: tzinfo) -> str:
    """What `crew remind` prints once the reminder is set."""
    when = format_local(parse_rfc3339(reminder["next_at"]), tz)
    repeat = repeat_text(reminder)
    repeating = f", repeating {repeat}" if repeat else ""
    return (
        f'Reminder set: "{reminder.get("title")}" on {when}{repeating}.\n'
        f"Then a reminder notice is posted in room {reminder.get('room_id')} and you are woken. "
        f"Cancel it with: crew remind cancel {reminder.get('id')}\n"
    )


def render_list(reminders: Sequence[Mapping[str, Any]], *, tz: tzinfo) -> str:
    """What `crew remind list` prints."""
    if not reminders:
        return "You have no reminders. Set one with: crew remind <room-id> <title> --in 1h\n"
    lines = ["Your reminders:"]
    for reminder in reminders:
        repeat = repeat_text(reminder)
        repeating = f", repeating {repeat}" if repeat else ""
        when = format_local(parse_rfc3339(reminder["next_at"]), tz)
        lines.append(
            f'- {reminder.get("id")}: "{reminder.get("title")}" in room {reminder.get("room_id")}, '
            f"next on {when}{repeating}"
        )
    return "\n".join(lines) + "\n"


def _list(*, stdout: Any) -> int:
    from crew_shim.times import local_zone

    answer = CrewServer.from_environment().call("GET", "/agent/reminders", effect=_EFFECT)
    reminders = expect_success(
        answer,
        refusals=Refusals(
            forbidden="the crew server does not let this agent list reminders. Tell the user.",
            not_found="the crew server has no reminders endpoint. Tell the user.",
        ),
        command="remind list",
    )
    tz, _ = local_zone()
    stdout.write(render_list(reminders or [], tz=tz))
    return 0


def _cancel(args: Args, *, stdout: Any) -> int:
    (value,) = expect_positionals(args, ["a reminder id"], command="remind cancel")
    reminder_id = check_id(value, what="reminder id", source="crew remind list")
    answer = CrewServer.from_environment().call(
        "DELETE", f"/agent/reminders/{reminder_id}", effect=_EFFECT
    )
    expect_success(
        answer,
        refusals=Refusals(
            forbidden=f"reminder {reminder_id} is not yours. See yours with: crew remind list",
            not_found=f"you have no reminder {reminder_id}. See yours with: crew remind list",
        ),
        command="remind cancel",
    )
    stdout.write(f"Reminder {reminder_id} cancelled.\n")
    return 0


def _rfc3339(when: datetime) -> str:
    return when.isoformat(timespec="seconds")
