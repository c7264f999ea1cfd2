"""`crew reply <room-id> [--thread <message-id>]`: send the body on stdin to a room."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from crew_shim.args import parse_args
from crew_shim.client import CrewServer, Effect
from crew_shim.common import Refusals, check_id, expect_success
from crew_shim.errors import InputError, UsageError

TYPE_CHECKING = False  # typing costs ~2 ms to import; annotations are strings here
if TYPE_CHECKING:
    from datetime import date, tzinfo
    from typing import Any, BinaryIO

MAX_BODY = 20_000
_MAX_READ = 1 << 20  # bytes; far above 20,000 characters of any script

HELD_FIRST = "Not sent: new messages arrived in this room."
HELD_LAST = "Run crew reply again to send as is or with changes, or do nothing."

_HEREDOC_HINT = "crew reply <room-id> <<'EOF' (the message on the next lines, then EOF)"

_EFFECT = Effect(
    unsent="sent",
    maybe=(
        "the message may have been sent. Sending the same crew reply again is safe: "
        "the server keeps it once"
    ),
)


def run(argv: Sequence[str], *, stdin: BinaryIO | None, stdout: Any) -> int:
    """Check everything locally, send once, print the outcome; return the exit code."""
    from crew_shim.help import REPLY_HELP

    args = parse_args(argv, options={"thread": 1}, command="reply")
    if args.help:
        stdout.write(REPLY_HELP)
        return 0
    if not args.positionals:
        raise UsageError(
            f"crew reply needs a room id. Write the message on stdin: {_HEREDOC_HINT}."
        )
    if len(args.positionals) > 1:
        raise InputError(
            "the message must come on stdin, not as arguments (the shell would rewrite "
            f"quotes, backticks and $). Use a heredoc: {_HEREDOC_HINT}."
        )
    room_id = check_id(args.positionals[0], what="room id")
    thread = args.option("thread")
    thread_of = check_id(thread, what="message id") if thread is not None else None
    if stdin is None or stdin.isatty():
        raise InputError(f"there is no message on stdin. Use a heredoc: {_HEREDOC_HINT}.")
    body = check_body(stdin.read(_MAX_READ + 1))

    request: dict[str, Any] = {"room_id": room_id, "body": body}
    if thread_of is not None:
        request["thread_of"] = thread_of
    server = CrewServer.from_environment()
    answer = server.call("POST", "/agent/reply", request, effect=_EFFECT)
    if answer.status == 409 and isinstance(answer.data, dict) and answer.data.get("held"):
        from crew_shim.times import local_zone

        tz, _ = local_zone()
        stdout.write(render_held(answer.data, tz=tz, today=_today(tz)))
        return 1
    target = f"message {thread_of} in room {room_id}" if thread_of else f"room {room_id}"
    data = expect_success(
        answer,
        refusals=Refusals(
            forbidden=(
                f"you may not write in room {room_id}: you are not a member, or it is someone "
                "else's direct chat. Reply only in rooms from your turn input."
            ),
            not_found=f"there is no {target}. Check the id in your turn input.",
        ),
        command="reply",
    )
    stdout.write(render_sent(data))
    return 0


def check_body(raw: bytes) -> str:
    """The body as sent: UTF-8, trailing whitespace removed, 1 to 20,000 characters."""
    if len(raw) > _MAX_READ:
        raise InputError(
            f"the message is over {_MAX_READ:,} bytes; the limit is {MAX_BODY:,} characters. "
            "Shorten it, or send it in several replies."
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"the message is not valid UTF-8 (bad byte at position {exc.start}). "
            "Write it as plain text in a heredoc."
        ) from exc
    body = text.rstrip()
    if not body:
        raise InputError(
            f"the message is empty. Write it on stdin with a heredoc: {_HEREDOC_HINT}."
        )
    if len(body) > MAX_BODY:
        raise InputError(
            f"the message is {len(body):,} characters long; the limit is {MAX_BODY:,}. "
            "Shorten it, or send it in several replies."
        )
    return body


def render_sent(data: Mapping[str, Any]) -> str:
    """`Message sent to room <id>.` and, for a thread, how later replies go there."""
    lines = [f"Message sent to room {data.get('room_id')}."]
    thread_id = data.get("thread_id")
    if thread_id:
        lines.append(
            f"It is in thread {thread_id}; send later replies in this thread with: "
            f"crew reply {thread_id}"
        )
    return "\n".join(lines) + "\n"


def render_held(data: Mapping[str, Any], *, tz: tzinfo, today: date | None) -> str:
    """The HELD text: not sent, the new messages as in the turn input, the next step."""
    from crew_shim.rendering import render_rooms

    rooms = render_rooms(
        data.get("rooms") or [], agent_id=str(data.get("agent_id") or ""), tz=tz, today=today
    )
    return f"{HELD_FIRST}\n\n{rooms}\n\n{HELD_LAST}\n"


def _today(tz: tzinfo) -> date:
    from datetime import datetime

    return datetime.now(tz).date()
