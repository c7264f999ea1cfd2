"""`crew task list|create|convert|claim|status|assign`: the tasks of a group.

A room id may be the group or a task's thread (the server resolves it);
handles may carry `@`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from crew_shim.args import Args, expect_positionals, parse_args
from crew_shim.client import CrewServer, Effect
from crew_shim.common import Refusals, check_id, expect_success
from crew_shim.errors import InputError, UsageError

STATUSES = ("todo", "in_progress", "in_review", "done")
MAX_TITLE = 200

_HANDLE = re.compile(r"[a-z0-9_-]{1,32}")
_NUMBER = re.compile(r"#?(\d{1,9})")

_SUBCOMMANDS = ("list", "create", "convert", "claim", "status", "assign")


def run(argv: Sequence[str], *, stdout: Any) -> int:
    """Run one `crew task` subcommand; return the exit code."""
    from crew_shim.help import TASK_HELP

    if not argv or argv[0] in ("-h", "--help"):
        if not argv:
            raise UsageError(
                f"crew task needs a subcommand ({'|'.join(_SUBCOMMANDS)}). "
                "Run crew task --help for how to use them."
            )
        stdout.write(TASK_HELP)
        return 0
    sub, rest = argv[0], argv[1:]
    if sub not in _SUBCOMMANDS:
        raise UsageError(
            f'crew task has no subcommand "{sub}" (it has {", ".join(_SUBCOMMANDS)}). '
            "Run crew task --help for how to use them."
        )
    command = f"task {sub}"
    options = (
        {"assignee": 1} if sub in ("create", "convert") else {"note": 1} if sub == "status" else {}
    )
    args = parse_args(rest, options=options, command=command)
    if args.help:
        stdout.write(TASK_HELP)
        return 0
    if sub == "list":
        return _list(args, stdout=stdout)
    request, method_path, verb, refusals = _plan(sub, args, command=command)
    data = _call(method_path, request, refusals=refusals, command=command)
    stdout.write(f"{verb} {describe_task(data)}\n{where_to_report(data)}\n")
    return 0


def describe_task(task: Mapping[str, Any]) -> str:
    """`task #3 "Write the note": in_progress, assigned to @alice.`"""
    assignee = task.get("assignee")
    who = f"assigned to @{assignee}" if assignee else "unassigned"
    return f'task #{task.get("number")} "{task.get("title")}": {task.get("status")}, {who}.'


def where_to_report(task: Mapping[str, Any]) -> str:
    """Where progress on a task goes: its thread, or a thread of its host message."""
    if task.get("thread_id"):
        return f"Report on it in its thread: crew reply {task['thread_id']}"
    return (
        "Report on it in a thread of its message: "
        f"crew reply {task.get('room_id')} --thread {task.get('host_message_id')}"
    )


def render_task_list(room_id: str, tasks: Sequence[Mapping[str, Any]]) -> str:
    """The lines of `crew task list`."""
    if not tasks:
        return (
            f"There are no tasks in room {room_id}. "
            f"Create one with: crew task create {room_id} <title>\n"
        )
    lines = [f"Tasks in room {room_id}:"]
    for task in tasks:
        thread = f" Thread: {task['thread_id']}" if task.get("thread_id") else ""
        lines.append(f"- {describe_task(task)}{thread}")
    return "\n".join(lines) + "\n"


def check_handle(value: str) -> str:
    """A handle without its `@`, lower-cased; refused locally when malformed."""
    handle = value.strip().removeprefix("@").lower()
    if _HANDLE.fullmatch(handle) is None:
        raise InputError(
            f'"{value}" is not a handle. Write it like @alice (letters, digits, _ and -, '
            "up to 32), as in the member list of your turn input."
        )
    return handle


def check_number(value: str) -> int:
    """A task number, `3` or `#3`."""
    match = _NUMBER.fullmatch(value.strip())
    if match is None or int(match.group(1)) < 1:
        raise InputError(
            f'"{value}" is not a task number. Write it like 3 or #3; '
            "crew task list <room-id> shows them."
        )
    return int(match.group(1))


def check_status(value: str) -> str:
    """One of todo, in_progress, in_review, done (`in-review`, `In Review` accepted)."""
    status = re.sub(r"[\s-]+", "_", value.strip().lower())
    if status not in STATUSES:
        raise InputError(f'"{value}" is not a task status. Use one of {", ".join(STATUSES)}.')
    return status


def check_title(words: Sequence[str]) -> str:
    """A task title from one or more words: not empty, at most 200 characters."""
    title = " ".join(word.strip() for word in words).strip()
    if not title:
        raise InputError(
            'the task title is empty. Give a short title, like "Write the release note".'
        )
    if len(title) > MAX_TITLE:
        raise InputError(
            f"the task title is {len(title)} characters long; the limit is {MAX_TITLE}. "
            "Shorten it and put the details in the task's thread."
        )
    return title


def _list(args: Args, *, stdout: Any) -> int:
    (room,) = expect_positionals(args, ["a room id"], command="task list")
    room_id = check_id(room, what="room id")
    tasks = _call(
        ("GET", f"/agent/tasks?room_id={room_id}"),
        None,
        refusals=_room_refusals(room_id),
        command="task list",
    )
    stdout.write(render_task_list(room_id, tasks or []))
    return 0


def _plan(
    sub: str, args: Args, *, command: str
) -> tuple[dict[str, Any], tuple[str, str], str, Refusals]:
    """The request of a changing subcommand, its verb and what its refusals mean."""
    if sub == "create":
        if not args.positionals:
            raise UsageError(
                "crew task create needs a room id and a title. Run crew task create --help."
            )
        room_id = check_id(args.positionals[0], what="room id")
        request: dict[str, Any] = {"room_id": room_id, "title": check_title(args.positionals[1:])}
        _add_assignee(request, args)
        return request, ("POST", "/agent/tasks"), "Created", _room_refusals(room_id)
    if sub == "convert":
        (message,) = expect_positionals(args, ["a message id"], command=command)
        message_id = check_id(message, what="message id")
        request = {"message_id": message_id}
        _add_assignee(request, args)
        return (
            request,
            ("POST", "/agent/tasks/convert"),
            "Created",
            Refusals(
                forbidden=f"you may not make a task of message {message_id}: it is not in a group you "
                "are a member of. Use a message id from a group in your turn input.",
                not_found=f"there is no message {message_id}. Copy the id from your turn input.",
            ),
        )
    names = {
        "claim": ["a room id", "a task number"],
        "status": ["a room id", "a task number", "a status"],
        "assign": ["a room id", "a task number", "a handle"],
    }[sub]
    values = expect_positionals(args, names, command=command)
    room_id = check_id(values[0], what="room id")
    number = check_number(values[1])
    path = f"/agent/tasks/{number}/{sub}"
    request = {"room_id": room_id}
    if sub == "status":
        request["status"] = check_status(values[2])
        note = args.option("note")
        if note is not None and note.strip():
            request["note"] = note.strip()
    elif sub == "assign":
        request["assignee"] = check_handle(values[2])
    verb = {"claim": "Claimed", "status": "Moved", "assign": "Assigned"}[sub]
    refusals = Refusals(
        forbidden=f"you are not a member of room {room_id}. Use tasks of rooms from your turn input.",
        not_found=(
            f"there is no task #{number} in room {room_id}. "
            f"See the tasks there with: crew task list {room_id}"
        ),
    )
    return request, ("POST", path), verb, refusals


def _add_assignee(request: dict[str, Any], args: Args) -> None:
    assignee = args.option("assignee")
    if assignee is not None:
        request["assignee"] = check_handle(assignee)


def _room_refusals(room_id: str) -> Refusals:
    return Refusals(
        forbidden=f"you are not a member of room {room_id}. Use tasks of rooms from your turn input.",
        not_found=f"there is no room {room_id}. Copy the room id from your turn input.",
    )


def _call(method_path: tuple[str, str], request: Any, *, refusals: Refusals, command: str) -> Any:
    method, path = method_path
    effect = Effect(
        unsent="changed",
        maybe=(
            "the change may have been made. Running the same command again is safe: "
            "the server does it once"
        ),
    )
    answer = CrewServer.from_environment().call(method, path, request, effect=effect)
    return expect_success(answer, refusals=refusals, command=command)
