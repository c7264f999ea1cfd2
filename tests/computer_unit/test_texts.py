"""AGENTS.md and the turn input, fixed by snapshots (UPDATE_SNAPSHOTS=1 rewrites them)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from computer_service.texts import (
    MEMORY_TEMPLATE,
    already_said,
    format_now,
    render_agents_md,
    render_turn_input,
)

SNAPSHOTS = Path(__file__).resolve().parent.parent / "snapshots"


@dataclass(frozen=True)
class Agent:
    id: str
    handle: str
    name: str
    persona: str


ALICE = Agent(
    id="a1a1a1a1-0000-4000-8000-000000000001",
    handle="alice",
    name="Alice",
    persona="You write release notes and keep the changelog tidy.\nYou are concise.",
)
BOB_ID = "b0b0b0b0-0000-4000-8000-000000000002"
TZ = timezone(timedelta(hours=8))
NOW = datetime(2026, 10, 6, 19, 14, 30, tzinfo=TZ)


def check_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"snapshot {name} missing: run with UPDATE_SNAPSHOTS=1 once and review it"
    assert text == path.read_text()


def test_agents_md_snapshot() -> None:
    check_snapshot("AGENTS.md", render_agents_md(ALICE))


def test_agents_md_has_no_paths_or_times_and_follows_settings() -> None:
    text = render_agents_md(ALICE)
    assert "/home" not in text and ".crew" not in text and "2026" not in text
    assert "@alice" in text and "release notes" in text
    other = render_agents_md(Agent(ALICE.id, "bob", "Bob", ""))
    assert "@bob" in other and "@alice" not in other
    assert "No persona was given" in other
    # Same settings, same text: the session digest stays stable.
    assert render_agents_md(ALICE) == text
    for section in (
        "## Persona",
        "HELD",
        "## Group chats",
        "## Threads",
        "## Tasks",
        "## Reminders",
        "## Memory",
        "Background processes",
    ):
        assert section in text


def test_memory_template() -> None:
    assert MEMORY_TEMPLATE.startswith("# MEMORY.md")
    assert "16 KB" in MEMORY_TEMPLATE and "long-term memory" in MEMORY_TEMPLATE


def author_user() -> dict[str, Any]:
    return {"kind": "user", "id": "user", "name": "User", "handle": None}


def author_agent(agent_id: str, name: str, handle: str) -> dict[str, Any]:
    return {"kind": "agent", "id": agent_id, "name": name, "handle": handle}


SYSTEM = {"kind": "system", "id": "system", "name": "Crew", "handle": None}
MEMBERS = [
    author_user(),
    author_agent(ALICE.id, "Alice", "alice"),
    author_agent(BOB_ID, "Bob", "bob"),
]


def message(
    room: str, seq: int, author: dict[str, Any], body: str, at: str, **extra: Any
) -> dict[str, Any]:
    return {
        "id": f"{room[:8]}-0000-4000-8000-{seq:012d}",
        "room_id": room,
        "seq": seq,
        "author": author,
        "body": body,
        "kind": extra.pop("kind", "normal"),
        "mentions": extra.pop("mentions", []),
        "task": extra.pop("task", None),
        "thread": extra.pop("thread", None),
        "created_at": at,
    }


GROUP = "7d0c0000-0000-4000-8000-00000000aaaa"
DM = "d1d10000-0000-4000-8000-00000000bbbb"
THREAD = "9e2a0000-0000-4000-8000-00000000cccc"
MUTED = "5a5a0000-0000-4000-8000-00000000dddd"


def rooms() -> list[dict[str, Any]]:
    group = {
        "id": GROUP,
        "kind": "group",
        "title": "launch",
        "members": MEMBERS,
        "parent_room_id": None,
        "parent_title": None,
        "root_message": None,
        "muted": False,
        "muted_until": None,
    }
    dm = {
        "id": DM,
        "kind": "dm",
        "title": None,
        "members": MEMBERS[:2],
        "parent_room_id": None,
        "parent_title": None,
        "root_message": None,
        "muted": False,
        "muted_until": None,
    }
    root = message(
        GROUP,
        40,
        author_user(),
        "Can someone check why the nightly build is red? " * 20,
        "2026-10-06T11:10:00Z",
        thread={"id": THREAD, "replies": 2, "last_at": "2026-10-06T11:12:00Z"},
    )
    thread = {
        "id": THREAD,
        "kind": "thread",
        "title": None,
        "members": MEMBERS,
        "parent_room_id": GROUP,
        "parent_title": "launch",
        "root_message": root,
        "muted": False,
        "muted_until": None,
    }
    muted = {
        "id": MUTED,
        "kind": "group",
        "title": "random",
        "members": MEMBERS,
        "parent_room_id": None,
        "parent_title": None,
        "root_message": None,
        "muted": True,
        "muted_until": "2026-10-07T10:00:00Z",
    }
    return [
        {
            "room": group,
            "messages": [
                message(
                    GROUP,
                    41,
                    author_user(),
                    "@alice can you write the release note?",
                    "2026-10-06T11:12:00Z",
                    mentions=[ALICE.id],
                ),
                message(
                    GROUP,
                    42,
                    author_agent(ALICE.id, "Alice", "alice"),
                    "On it.",
                    "2026-10-06T11:13:00Z",
                    task={
                        "number": 3,
                        "title": "release note",
                        "status": "in_progress",
                        "assignee": "alice",
                    },
                ),
                message(
                    GROUP,
                    43,
                    SYSTEM,
                    "Reminder from @alice: check the build",
                    "2026-10-06T11:13:30Z",
                    kind="notice",
                ),
            ],
        },
        {
            "room": dm,
            "messages": [
                message(
                    DM,
                    7,
                    author_user(),
                    "Thanks!\nAlso: what's left for Friday?",
                    "2026-10-05T23:50:00Z",
                ),
                # Its answer came back unacked (the turn was stopped after replying).
                message(
                    DM,
                    8,
                    author_agent(ALICE.id, "Alice", "alice"),
                    "Only the changelog.",
                    "2026-10-05T23:51:00Z",
                ),
            ],
        },
        {
            "room": thread,
            "messages": [
                message(
                    THREAD,
                    1,
                    author_agent(BOB_ID, "Bob", "bob"),
                    "Looking at it.",
                    "2026-10-06T11:12:00Z",
                ),
                message(
                    THREAD,
                    2,
                    author_user(),
                    "@alice any idea?",
                    "2026-10-06T11:14:00Z",
                    mentions=[ALICE.id],
                ),
            ],
        },
        {
            "room": muted,
            "messages": [
                message(
                    MUTED, 9, author_agent(BOB_ID, "Bob", "bob"), "lunch?", "2026-10-06T11:00:00Z"
                ),
            ],
        },
    ]


def test_turn_prompt_snapshot() -> None:
    text = render_turn_input(NOW, rooms(), ALICE, new_session=True, memory_size=20_000)
    check_snapshot("turn-prompt.md", text)


def test_turn_prompt_facts() -> None:
    text = render_turn_input(NOW, rooms(), ALICE, new_session=True, memory_size=100)
    assert text.startswith(
        "It is Tuesday 2026-10-06 19:14 (+08:00).\nThis is a new session: read MEMORY.md first.\n\n"
    )
    assert "over the 16 KB limit" not in text
    assert "[mentions you]" in text and "[notice]" in text
    assert "Alice (@alice, you)" in text and "(you muted it" in text
    assert "[task #3 in_progress, assigned to @alice]" in text
    for room in (GROUP, DM, THREAD, MUTED):
        assert f"crew reply {room}" in text
    assert text.endswith("\n") and not text.endswith("\n\n")


def render_stub(rooms: list[Any], *, agent_id: str, tz: Any, today: Any) -> str:
    return f"ROOMS n={len(rooms)} agent={agent_id} tz={tz} today={today}"


@pytest.mark.parametrize(
    ("new_session", "memory_size", "expected_lines"),
    [
        (False, None, ["It is Tuesday 2026-10-06 19:14 (+08:00)."]),
        (False, 99_999, ["It is Tuesday 2026-10-06 19:14 (+08:00)."]),
        (
            True,
            None,
            [
                "It is Tuesday 2026-10-06 19:14 (+08:00).",
                "This is a new session: read MEMORY.md first.",
            ],
        ),
        (
            True,
            16 * 1024,
            [
                "It is Tuesday 2026-10-06 19:14 (+08:00).",
                "This is a new session: read MEMORY.md first.",
            ],
        ),
        (
            True,
            16 * 1024 + 1,
            [
                "It is Tuesday 2026-10-06 19:14 (+08:00).",
                "This is a new session: read MEMORY.md first.",
                "MEMORY.md is 16 KB, over the 16 KB limit: shorten it in this turn, "
                "keeping what has lasting value.",
            ],
        ),
    ],
)
def test_turn_input_header_table(
    new_session: bool, memory_size: int | None, expected_lines: list[str]
) -> None:
    text = render_turn_input(
        NOW, rooms(), ALICE, new_session, memory_size, render_rooms=render_stub
    )
    head, body = text.split("\n\n", 1)
    assert head.split("\n") == expected_lines
    # One section per room, each rendered alone (the already-said line goes into it).
    section = f"ROOMS n=1 agent={ALICE.id} tz=UTC+08:00 today=2026-10-06"
    said = (
        "You already replied here (#8) after the last message from anyone else: "
        "do not say it again. Reply only if something is still unanswered."
    )
    assert body == "\n\n".join([section, f"{said}\n{section}", section, section]) + "\n"


def test_turn_input_accepts_models_and_needs_aware_time() -> None:
    class Model:
        def model_dump(self, mode: str) -> dict[str, Any]:
            assert mode == "json"
            return rooms()[0]

    text = render_turn_input(NOW, [Model()], ALICE, False, None, render_rooms=render_stub)
    assert "n=1" in text
    with pytest.raises(ValueError, match="aware"):
        render_turn_input(
            NOW.replace(tzinfo=None), [], ALICE, False, None, render_rooms=render_stub
        )


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        (datetime(2026, 10, 5, 19, 14, tzinfo=TZ), "Monday 2026-10-05 19:14 (+08:00)"),
        (datetime(2026, 1, 1, 0, 0, tzinfo=UTC), "Thursday 2026-01-01 00:00 (+00:00)"),
        (
            datetime(2026, 3, 1, 9, 5, tzinfo=timezone(-timedelta(hours=3, minutes=30))),
            "Sunday 2026-03-01 09:05 (-03:30)",
        ),
    ],
)
def test_format_now(when: datetime, expected: str) -> None:
    assert format_now(when) == expected


def test_turn_input_from_upstream_models_matches_dicts() -> None:
    """The runner passes `UnreadRoom` models; they must render exactly like the JSON."""
    from computer_service.upstream import UnreadRoom

    models = [UnreadRoom.model_validate(r) for r in rooms()]
    assert render_turn_input(NOW, models, ALICE, False, None) == render_turn_input(
        NOW, rooms(), ALICE, False, None
    )


@pytest.mark.parametrize(
    ("authors", "said"),
    [
        (["user", "me"], [2]),
        (["user", "me", "me"], [2, 3]),
        (["me", "user"], []),  # a message after its reply: not answered yet
        (["user", "system"], []),  # a notice (a reminder firing) is new work too
        (["user", "bob"], []),
        (["me"], [1]),
        ([], []),
    ],
)
def test_already_said_is_the_agents_own_messages_after_anybody_elses(
    authors: list[str], said: list[int]
) -> None:
    who = {
        "user": author_user(),
        "me": author_agent(ALICE.id, "Alice", "alice"),
        "bob": author_agent(BOB_ID, "Bob", "bob"),
        "system": SYSTEM,
    }
    messages = [
        message(DM, seq, who[a], "x", "2026-10-06T11:00:00Z") for seq, a in enumerate(authors, 1)
    ]
    assert already_said(messages, ALICE.id) == said
