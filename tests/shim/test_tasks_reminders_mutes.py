"""`crew task`, `crew remind`, `crew mute`/`unmute` against a real crew-server."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from crew_harness.waiting import wait_until
from tests.shim.world import World

pytestmark = pytest.mark.timeout(60)


def _agent_get(world: World, path: str, token_file: Any) -> Any:
    token = token_file.read_text().strip()
    answer = httpx.get(
        f"{world.server.url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def _last_line_id(stdout: str) -> str:
    return stdout.rstrip("\n").rsplit(" ", 1)[1]


def test_task_lifecycle(world: World) -> None:
    group = world.group["id"]
    empty = world.crew("task", "list", group)
    assert empty.code == 0 and empty.stdout.startswith(f"There are no tasks in room {group}.")
    world.check("task list: none", empty)

    created = world.crew(
        "task", "create", group, "Write", "the", "release note", "--assignee", "@Alice"
    )
    assert created.code == 0, created.stderr
    assert created.stdout.startswith(
        'Created task #1 "Write the release note": todo, assigned to @alice.\n'
    )
    thread_id = _last_line_id(created.stdout)
    world.normalise.name(thread_id, "task-thread")
    assert created.stdout.endswith(f"Report on it in its thread: crew reply {thread_id}\n")
    world.check("task create", created)

    listed = world.crew("task", "list", thread_id)  # a task's thread stands for its group
    assert listed.code == 0, listed.stderr
    assert 'task #1 "Write the release note": todo, assigned to @alice.' in listed.stdout
    world.check("task list: by the task's thread", listed)

    refused = world.crew("task", "claim", group, "1", agent=world.bob)
    assert refused.code == 1 and refused.stdout == ""
    world.check("task claim: refused (someone else holds it)", refused)

    claimed = world.crew("task", "claim", group, "#1")
    assert claimed.code == 0 and "in_progress, assigned to @alice" in claimed.stdout
    world.check("task claim", claimed)

    moved = world.crew(
        "task", "status", thread_id, "1", "in-review", "--note", "Draft in work/notes.md"
    )
    assert moved.code == 0 and "in_review" in moved.stdout
    world.check("task status with a note", moved)
    notices = [m["body"] for m in world.messages(thread_id) if m["kind"] == "notice"]
    assert any("Draft in work/notes.md" in body for body in notices), notices

    assigned = world.crew("task", "assign", group, "1", "bob")
    assert assigned.code == 0 and "assigned to @bob" in assigned.stdout
    world.check("task assign", assigned)
    tasks = _agent_get(world, f"/agent/tasks?room_id={group}", world.alice.token_file)
    assert [(t["number"], t["status"], t["assignee"]) for t in tasks] == [(1, "in_review", "bob")]


def test_task_convert_and_refusals(world: World) -> None:
    group = world.group["id"]
    message = world.server.post(group, "Please fix the login page")
    world.normalise.name(message["id"], "message")
    converted = world.crew("task", "convert", message["id"], "--assignee", "@bob")
    assert converted.code == 0, converted.stderr
    assert converted.stdout.startswith(
        'Created task #1 "Please fix the login page": todo, assigned to @bob.\n'
    )
    world.check("task convert", converted)

    for name, argv in (
        ("no subcommand", ["task"]),
        ("unknown subcommand", ["task", "close", group, "1"]),
        ("bad status", ["task", "status", group, "1", "doing"]),
        ("bad number", ["task", "claim", group, "one"]),
        ("bad handle", ["task", "assign", group, "1", "@Bob Smith"]),
        ("missing number", ["task", "claim", group]),
        ("no such task", ["task", "claim", group, "7"]),
        ("not a member", ["task", "list", world.bob_dm["id"]]),
    ):
        result = world.crew(*argv)
        assert result.code == 1 and result.stdout == "", (name, result)
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
        world.check(f"task refused: {name}", result)


def test_reminders_set_list_fire_cancel(world: World) -> None:
    group = world.group["id"]
    before = datetime.now(UTC)
    once = world.crew("remind", group, "check the build", "--in", "10m")
    after = datetime.now(UTC)
    assert once.code == 0, once.stderr
    reminder_id = _last_line_id(once.stdout)
    world.normalise.name(reminder_id, "reminder")
    world.check("remind --in", once)
    stretch = world.crew("remind", group, "stretch", "--every", "2h")
    assert stretch.code == 0, stretch.stderr
    world.normalise.name(_last_line_id(stretch.stdout), "reminder-stretch")
    world.check("remind --every", stretch)
    assert world.crew("remind", group, "later", "--in", "3d").code == 0

    # In the order they fire: in 10 minutes, in 2 hours, in 3 days.
    listed = world.crew("remind", "list")
    assert listed.code == 0 and listed.stdout.count("\n- ") == 3
    world.check("remind list", listed)

    for argv, name in (
        (["standup", "--daily", "9:00"], "remind --daily"),
        (["weekly review", "--weekly", "mon", "09:00"], "remind --weekly"),
        (["call", "--at", "23:59"], "remind --at"),
    ):
        result = world.crew("remind", group, *argv)
        assert result.code == 0, result.stderr
        world.normalise.name(_last_line_id(result.stdout), f"reminder-{argv[0].replace(' ', '-')}")
        world.check(name, result)

    stored = {r["title"]: r for r in _agent_get(world, "/agent/reminders", world.alice.token_file)}
    next_at = datetime.fromisoformat(stored["check the build"]["next_at"])
    assert before + timedelta(minutes=10) - timedelta(seconds=1) <= next_at
    assert next_at <= after + timedelta(minutes=10) + timedelta(seconds=1)
    assert stored["standup"]["daily"] == "09:00" and stored["stretch"]["every"] == 7200
    assert stored["weekly review"]["weekly"] == {"day": "mon", "time": "09:00"}
    call_at = datetime.fromisoformat(stored["call"]["next_at"]).astimezone()
    assert call_at.strftime("%H:%M") == "23:59" and call_at - datetime.now(UTC) < timedelta(days=1)

    # The server fires what is due: "check the build", and whichever of the clock-time
    # reminders falls within the next 11 minutes of the local day (run at 23:50, "call" too).
    fire_by = datetime.now(UTC) + timedelta(minutes=11)
    due = sorted(t for t, r in stored.items() if datetime.fromisoformat(r["next_at"]) <= fire_by)
    assert "check the build" in due
    world.server.advance_clock(11 * 60)

    def all_notices() -> list[str] | None:
        bodies = [m["body"] for m in world.messages(group) if m["kind"] == "notice"]
        return bodies if len(bodies) >= len(due) else None

    notices = wait_until("the reminder notices", all_notices, 5)
    assert sorted(notices) == [f"Reminder from @alice: {t}" for t in due]

    cancel = world.crew("remind", "cancel", stored["stretch"]["id"])
    assert (cancel.code, cancel.stdout) == (0, f"Reminder {stored['stretch']['id']} cancelled.\n")
    world.check("remind cancel", cancel)
    titles = {r["title"] for r in _agent_get(world, "/agent/reminders", world.alice.token_file)}
    # A one-time reminder is gone once it fired; repeating ones stay.
    fired_once = set(due) - {"standup", "weekly review"}
    assert titles == {"later", "standup", "weekly review", "call"} - fired_once

    # The same cancel again in the turn is the same write (its idempotency key): done once.
    again = world.crew("remind", "cancel", stored["stretch"]["id"])
    assert (again.code, again.stdout) == (0, cancel.stdout)
    gone = world.crew("remind", "cancel", str(uuid.uuid4()))
    assert gone.code == 1
    world.check("remind cancel: unknown", gone)


def test_reminder_refusals(world: World) -> None:
    group = world.group["id"]
    for name, argv in (
        ("period under 15 minutes", [group, "x", "--every", "10m"]),
        ("malformed time", [group, "x", "--at", "6pm"]),
        ("time passed", [group, "x", "--at", "2020-01-01 09:00"]),
        ("two schedules", [group, "x", "--in", "1h", "--daily", "09:00"]),
        ("no schedule", [group, "x"]),
        ("bad duration", [group, "x", "--in", "soon"]),
        ("bad weekday", [group, "x", "--weekly", "someday", "09:00"]),
        ("not a member", [world.bob_dm["id"], "x", "--in", "1h"]),
    ):
        result = world.crew("remind", *argv)
        assert result.code == 1 and result.stdout == "", (name, result)
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
        world.check(f"remind refused: {name}", result)
    assert _agent_get(world, "/agent/reminders", world.alice.token_file) == []
    empty = world.crew("remind", "list")
    assert empty.code == 0 and empty.stdout.startswith("You have no reminders.")
    world.check("remind list: none", empty)


def test_mute_and_unmute(world: World) -> None:
    group = world.group["id"]
    timed = world.crew("mute", group, "--for", "2h")
    assert timed.code == 0, timed.stderr
    assert timed.stdout.startswith(f"Muted room {group} until ")
    world.check("mute --for", timed)

    # A muted group's section says so (here in a HELD answer).
    world.server.post(group, "lunch?")
    held = world.crew("reply", group, stdin="sure")
    assert held.code == 1 and '## Group "launch" (you muted it until ' in held.stdout
    world.check("reply: held in a muted group", held)

    forever = world.crew("mute", group)
    assert forever.code == 0 and "until you unmute it" in forever.stdout
    world.check("mute until unmuted", forever)

    unmuted = world.crew("unmute", group)
    assert (unmuted.code, unmuted.stderr) == (0, "")
    world.check("unmute", unmuted)

    for name, argv in (
        ("too short", ["mute", group, "--for", "10m"]),
        ("too long", ["mute", group, "--for", "8d"]),
        ("a dm", ["mute", world.dm["id"]]),
        ("not a room id", ["mute", "launch"]),
    ):
        result = world.crew(*argv)
        assert result.code == 1 and result.stdout == "", (name, result)
        world.check(f"mute refused: {name}", result)
