"""The shared room renderer (turn input and HELD answers) and the shim's pure outputs."""

from __future__ import annotations

from datetime import date
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from crew_shim.__main__ import error_line
from crew_shim.client import Answer
from crew_shim.common import Refusals, check_id, expect_success
from crew_shim.errors import InputError, ServerRefused
from crew_shim.rendering import ROOT_BODY_LIMIT, author_label, message_line, render_rooms
from crew_shim.reply import MAX_BODY, check_body, render_held, render_sent
from crew_shim.tasks import check_handle, check_number, check_status, describe_task

TZ = ZoneInfo("Asia/Shanghai")
ALICE = "a11ce000-0000-4000-8000-000000000001"
BOB = "b0b00000-0000-4000-8000-000000000002"
GROUP = "7d0c0000-0000-4000-8000-00000000aaaa"
THREAD = "9e2a0000-0000-4000-8000-00000000cccc"

USER = {"kind": "user", "id": "user", "name": "User", "handle": None}
ALICE_AUTHOR = {"kind": "agent", "id": ALICE, "name": "Alice", "handle": "alice"}
BOB_AUTHOR = {"kind": "agent", "id": BOB, "name": "Bob", "handle": "bob"}
SYSTEM = {"kind": "system", "id": "system", "name": "Crew", "handle": None}


def msg(seq: int, author: dict[str, Any], body: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": f"7d0c0000-0000-4000-8000-0000000000{seq:02d}",
        "room_id": GROUP,
        "seq": seq,
        "author": author,
        "body": body,
        "kind": "normal",
        "mentions": [],
        "task": None,
        "thread": None,
        "created_at": "2026-10-06T11:12:00Z",  # 19:12 in Shanghai
    }
    base.update(extra)
    return base


def group(**extra: Any) -> dict[str, Any]:
    room: dict[str, Any] = {
        "id": GROUP,
        "kind": "group",
        "title": "launch",
        "members": [USER, ALICE_AUTHOR, BOB_AUTHOR],
        "parent_room_id": None,
        "parent_title": None,
        "root_message": None,
        "muted": False,
        "muted_until": None,
    }
    room.update(extra)
    return room


def test_message_line_tags_in_order() -> None:
    line = message_line(
        msg(
            41,
            USER,
            "@alice please",
            mentions=[ALICE],
            task={"number": 3, "title": "t", "status": "in_progress", "assignee": "alice"},
            thread={"id": THREAD, "replies": 2, "last_at": "2026-10-06T11:13:00Z"},
        ),
        agent_id=ALICE,
        tz=TZ,
        show_id=True,
    )
    assert line == (
        "- [#41 19:12] User (user): @alice please [task #3 in_progress, assigned to @alice] "
        "[thread: 2 replies] [mentions you] (id 7d0c0000-0000-4000-8000-000000000041)"
    )
    notice = message_line(
        msg(43, SYSTEM, "Reminder from @alice: x", kind="notice"), agent_id=ALICE, tz=TZ
    )
    assert notice == "- [#43 19:12] Crew (system): Reminder from @alice: x [notice]"
    unassigned = message_line(
        msg(5, BOB_AUTHOR, "t", task={"number": 1, "status": "todo", "assignee": None}),
        agent_id=ALICE,
        tz=TZ,
    )
    assert unassigned.endswith("[task #1 todo, unassigned]")


def test_authors_and_you() -> None:
    assert author_label(USER, agent_id=ALICE) == "User (user)"
    assert author_label(ALICE_AUTHOR, agent_id=ALICE) == "Alice (@alice, you)"
    assert author_label(BOB_AUTHOR, agent_id=ALICE) == "Bob (@bob)"
    # No agent known: nobody is "you" and nothing "mentions you".
    assert author_label(ALICE_AUTHOR, agent_id="") == "Alice (@alice)"
    line = message_line(msg(1, USER, "@alice", mentions=[ALICE]), agent_id="", tz=TZ)
    assert "[mentions you]" not in line


def test_multiline_bodies_and_other_days() -> None:
    line = message_line(
        msg(7, USER, "first\nsecond", created_at="2026-10-05T23:50:00Z"),
        agent_id=ALICE,
        tz=TZ,
        today=date(2026, 10, 6),
    )
    # 23:50 UTC on the 5th is 07:50 on the 6th in Shanghai: today, so only the clock.
    assert line == "- [#7 07:50] User (user): first\n  second"
    older = message_line(
        msg(7, USER, "x", created_at="2026-10-04T11:00:00+00:00"),
        agent_id=ALICE,
        tz=TZ,
        today=date(2026, 10, 6),
    )
    assert older.startswith("- [#7 2026-10-04 19:00] ")


def test_group_dm_muted_and_thread_sections() -> None:
    text = render_rooms(
        [
            {"room": group(), "messages": [msg(41, USER, "hi")]},
            {
                "room": group(muted=True, muted_until="2026-10-07T10:00:00Z", title="random"),
                "messages": [],
            },
            {"room": group(muted=True, title=None), "messages": []},
            {
                "room": group(
                    id="d1d10000-0000-4000-8000-00000000bbbb",
                    kind="dm",
                    title=None,
                    members=[USER, ALICE_AUTHOR],
                ),
                "messages": [msg(2, USER, "yo")],
            },
        ],
        agent_id=ALICE,
        tz=TZ,
    )
    sections = text.split("\n\n")
    assert sections[0] == (
        '## Group "launch" — members: User (user), Alice (@alice, you), Bob (@bob)\n'
        "- [#41 19:12] User (user): hi (id 7d0c0000-0000-4000-8000-000000000041)\n"
        f"Reply with: crew reply {GROUP}"
    )
    assert sections[1].startswith(
        '## Group "random" (you muted it until Wed 2026-10-07 18:00 +08:00) — members: '
    )
    assert sections[2].startswith("## Group (untitled) (you muted it) — members: ")
    # Message ids only where they are used (groups): not in a dm.
    assert sections[3] == (
        "## Direct chat — members: User (user), Alice (@alice, you)\n"
        "- [#2 19:12] User (user): yo\n"
        "Reply with: crew reply d1d10000-0000-4000-8000-00000000bbbb"
    )
    assert not text.endswith("\n")


def test_thread_section_cuts_the_root_message() -> None:
    root = msg(40, USER, "x" * (ROOT_BODY_LIMIT + 50))
    thread = group(
        id=THREAD,
        kind="thread",
        title=None,
        parent_room_id=GROUP,
        parent_title="launch",
        root_message=root,
    )
    text = render_rooms(
        [{"room": thread, "messages": [msg(1, BOB_AUTHOR, "on it", room_id=THREAD)]}],
        agent_id=ALICE,
        tz=TZ,
    )
    lines = text.split("\n")
    assert lines[0] == (
        f'## Thread in group "launch" (room {GROUP}) — members: '
        "User (user), Alice (@alice, you), Bob (@bob)"
    )
    assert lines[1] == (
        f"Root: [#40 19:12] User (user): {'x' * ROOT_BODY_LIMIT}… "
        "(id 7d0c0000-0000-4000-8000-000000000040)"
    )
    assert lines[2] == "- [#1 19:12] Bob (@bob): on it"
    assert lines[3] == f"Reply with: crew reply {THREAD}"
    short = render_rooms(
        [
            {
                "room": {**thread, "root_message": msg(40, USER, "y" * ROOT_BODY_LIMIT)},
                "messages": [],
            }
        ],
        agent_id=ALICE,
        tz=TZ,
    )
    assert f"{'y' * ROOT_BODY_LIMIT} (id" in short and "…" not in short


def test_a_task_thread_in_a_dm_names_the_direct_chat() -> None:
    dm_id = "d1d10000-0000-4000-8000-00000000bbbb"
    thread = group(
        id=THREAD,
        kind="thread",
        title=None,
        members=[USER, ALICE_AUTHOR],
        parent_room_id=dm_id,
        parent_title=None,
        parent_kind="dm",
        root_message=msg(3, USER, "write the report", room_id=dm_id),
    )
    text = render_rooms([{"room": thread, "messages": []}], agent_id=ALICE, tz=TZ)
    assert text.split("\n")[0] == (
        f"## Thread in the direct chat (room {dm_id}) — members: User (user), Alice (@alice, you)"
    )
    assert "untitled" not in text


def test_held_and_sent_texts() -> None:
    held = render_held(
        {
            "held": True,
            "agent_id": ALICE,
            "rooms": [{"room": group(), "messages": [msg(41, BOB_AUTHOR, "wait")]}],
        },
        tz=TZ,
        today=None,
    )
    assert held == (
        "Not sent: new messages arrived in this room.\n\n"
        '## Group "launch" — members: User (user), Alice (@alice, you), Bob (@bob)\n'
        "- [#41 19:12] Bob (@bob): wait (id 7d0c0000-0000-4000-8000-000000000041)\n"
        f"Reply with: crew reply {GROUP}\n\n"
        "Run crew reply again to send as is or with changes, or do nothing.\n"
    )
    assert render_sent({"message_id": "m", "room_id": GROUP}) == f"Message sent to room {GROUP}.\n"
    assert render_sent({"message_id": "m", "room_id": THREAD, "thread_id": THREAD}) == (
        f"Message sent to room {THREAD}.\n"
        f"It is in thread {THREAD}; send later replies in this thread with: crew reply {THREAD}\n"
    )


def test_bodies() -> None:
    assert check_body(b"  hello `x` $(y)\n\n \t") == "  hello `x` $(y)"
    assert check_body("é🙂\n".encode()) == "é🙂"
    assert check_body(("🙂" * MAX_BODY).encode()) == "🙂" * MAX_BODY
    with pytest.raises(InputError, match="20,001 characters long; the limit is 20,000"):
        check_body(b"a" * (MAX_BODY + 1))
    with pytest.raises(InputError, match="the message is empty"):
        check_body(b" \n\t\n")
    with pytest.raises(InputError, match="not valid UTF-8"):
        check_body(b"ok \xff")


def test_ids_handles_numbers_statuses() -> None:
    assert check_id(" 7D0C0000-0000-4000-8000-00000000AAAA ", what="room id") == GROUP
    with pytest.raises(InputError, match='"7d0c…" is not a room id'):
        check_id("7d0c…", what="room id")
    assert check_handle("@Alice") == "alice"
    with pytest.raises(InputError, match="is not a handle"):
        check_handle("@al ice")
    assert check_number("#3") == 3
    with pytest.raises(InputError, match="is not a task number"):
        check_number("three")
    assert check_status("In Review") == "in_review"
    assert check_status("in-progress") == "in_progress"
    with pytest.raises(InputError, match="Use one of todo, in_progress, in_review, done"):
        check_status("doing")
    assert describe_task({"number": 3, "title": "T", "status": "todo", "assignee": None}) == (
        'task #3 "T": todo, unassigned.'
    )


REFUSALS = Refusals(forbidden="not a member of X. Do Y.", not_found="no X. Do Z.")


@pytest.mark.parametrize(
    ("status", "data", "line"),
    [
        (
            403,
            {"error": {"code": "refused", "message": "Only the assignee can move this task."}},
            "Only the assignee can move this task.",
        ),
        (
            401,
            {"error": {"code": "unauthorized", "message": "bad token"}},
            "the crew server no longer accepts this agent's token",
        ),
        (403, {"error": {"code": "forbidden", "message": "no"}}, "not a member of X. Do Y."),
        (404, None, "no X. Do Z."),
        (
            422,
            {"error": {"code": "invalid", "message": "title too long."}},
            "the crew server refused the request (HTTP 422: title too long). Check the command with crew reply --help.",
        ),
        (500, "oops", "the crew server failed (HTTP 500). Try again in a minute"),
    ],
)
def test_server_answers_are_translated(status: int, data: Any, line: str) -> None:
    with pytest.raises(ServerRefused) as caught:
        expect_success(Answer(status, data), refusals=REFUSALS, command="reply")
    assert caught.value.line.startswith(line)


def test_error_line_is_one_sentence_line() -> None:
    assert error_line("a\nb. See crew remind list") == "error: a b. See crew remind list.\n"
    assert error_line("done.") == "error: done.\n"


def test_task_description() -> None:
    task = {"number": 2, "title": "Ship", "status": "in_review", "assignee": "bob"}
    assert describe_task(task) == 'task #2 "Ship": in_review, assigned to @bob.'
