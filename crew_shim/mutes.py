"""`crew mute <room-id> [--for 2h]` and `crew unmute <room-id>`: quiet a group."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, tzinfo
from typing import Any

from crew_shim.args import expect_positionals, parse_args
from crew_shim.client import CrewServer, Effect
from crew_shim.common import Refusals, check_id, expect_success
from crew_shim.times import check_mute, format_local, parse_duration, parse_rfc3339

_EFFECT = Effect(
    unsent="changed",
    maybe=(
        "the change may have been made. Running the same command again is safe: "
        "the server does it once"
    ),
)


def run_mute(argv: Sequence[str], *, stdout: Any) -> int:
    """`crew mute <room-id> [--for 2h]`; return the exit code."""
    from crew_shim.help import MUTE_HELP

    args = parse_args(argv, options={"for": 1}, command="mute")
    if args.help:
        stdout.write(MUTE_HELP)
        return 0
    (value,) = expect_positionals(args, ["a room id"], command="mute")
    room_id = check_id(value, what="room id")
    request: dict[str, Any] = {}
    duration = args.option("for")
    if duration is not None:
        until = datetime.now(UTC) + check_mute(parse_duration(duration, option="--for"))
        request["until"] = until.isoformat(timespec="seconds")
    answer = CrewServer.from_environment().call(
        "PUT", f"/agent/mutes/{room_id}", request, effect=_EFFECT
    )
    data = expect_success(answer, refusals=_refusals(room_id), command="mute")
    from crew_shim.times import local_zone

    tz, _ = local_zone()
    stdout.write(render_muted(room_id, data or {}, tz=tz))
    return 0


def run_unmute(argv: Sequence[str], *, stdout: Any) -> int:
    """`crew unmute <room-id>`; return the exit code."""
    from crew_shim.help import MUTE_HELP

    args = parse_args(argv, options={}, command="unmute")
    if args.help:
        stdout.write(MUTE_HELP)
        return 0
    (value,) = expect_positionals(args, ["a room id"], command="unmute")
    room_id = check_id(value, what="room id")
    answer = CrewServer.from_environment().call("DELETE", f"/agent/mutes/{room_id}", effect=_EFFECT)
    expect_success(answer, refusals=_refusals(room_id), command="unmute")
    stdout.write(f"Unmuted room {room_id}: every new message there wakes you again.\n")
    return 0


def render_muted(room_id: str, data: Mapping[str, Any], *, tz: tzinfo) -> str:
    """Until when the group is muted, and what still wakes the agent."""
    until = data.get("until")
    when = (
        f"until {format_local(parse_rfc3339(until), tz)}"
        if until
        else f"until you unmute it (crew unmute {room_id})"
    )
    return (
        f"Muted room {room_id} {when}.\n"
        "An @mention of you there still wakes you; other messages wait for your next turn.\n"
    )


def _refusals(room_id: str) -> Refusals:
    return Refusals(
        forbidden=f"you are not a member of room {room_id}. Mute only groups from your turn input.",
        not_found=f"there is no room {room_id}. Copy the room id from your turn input.",
    )
