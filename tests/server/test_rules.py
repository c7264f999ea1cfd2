"""Table tests of the pure rules: mentions, who is woken, schedules, mute limits, notices."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from crew_server import rules

MEMBERS = {"alice": "A", "bob": "B", "bob-x": "BX", "carol_1": "C"}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("@alice hi", ["A"]),
        ("hi @alice, @bob.", ["A", "B"]),
        ("@bob-x and @bob", ["BX", "B"]),
        ("@bob- please", ["B"]),
        ("@carol_1!", ["C"]),
        ("@alice @alice", ["A"]),
        ("mail alice@bob.com", []),
        ("@dave is not here", []),
        ("@Alice is not a handle", []),
        ("no mention", []),
    ],
)
def test_mentions(body: str, expected: list[str]) -> None:
    assert rules.mentioned_ids(body, MEMBERS) == expected


GROUP = rules.RoomFacts("group", frozenset({"A", "B", "C"}), frozenset({"C"}))


@pytest.mark.parametrize(
    ("room", "author", "mentions", "woken"),
    [
        (rules.RoomFacts("dm", frozenset({"A"}), frozenset()), "user", [], ["A"]),
        (rules.RoomFacts("dm", frozenset({"A"}), frozenset()), "A", [], []),
        (GROUP, "user", [], ["A", "B"]),
        (GROUP, "A", [], ["B"]),
        (GROUP, "A", ["C"], ["B", "C"]),
        (GROUP, "user", ["A"], ["A", "B"]),
        (rules.RoomFacts("thread", frozenset({"A"}), frozenset()), "user", ["B"], ["A", "B"]),
        (rules.RoomFacts("thread", frozenset({"A", "B"}), frozenset()), "B", [], ["A"]),
    ],
)
def test_who_is_woken(
    room: rules.RoomFacts, author: str, mentions: list[str], woken: list[str]
) -> None:
    assert rules.woken_by_message(room, author, mentions) == woken


MONDAY_9 = datetime(2026, 10, 5, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule", "first"),
    [
        (rules.Schedule(at=MONDAY_9 - timedelta(hours=1)), MONDAY_9 - timedelta(hours=1)),
        (rules.Schedule(every=900), MONDAY_9 + timedelta(minutes=15)),
        (rules.Schedule(daily="09:00"), MONDAY_9 + timedelta(days=1)),  # strictly after now
        (rules.Schedule(daily="09:01"), MONDAY_9 + timedelta(minutes=1)),
        (rules.Schedule(daily="08:00", tz="-02:00"), datetime(2026, 10, 5, 10, 0, tzinfo=UTC)),
        (
            rules.Schedule(weekly_day="mon", weekly_time="08:00"),
            datetime(2026, 10, 12, 8, tzinfo=UTC),
        ),
        (
            rules.Schedule(weekly_day="sun", weekly_time="23:30", tz="Asia/Tokyo"),
            datetime(2026, 10, 11, 14, 30, tzinfo=UTC),
        ),
    ],
)
def test_first_fire(schedule: rules.Schedule, first: datetime) -> None:
    assert rules.first_fire(schedule, MONDAY_9) == first


def test_next_fire_skips_missed_periods_and_one_offs_end() -> None:
    every = rules.Schedule(every=3600)
    due = MONDAY_9
    assert rules.next_fire(every, due, due) == due + timedelta(hours=1)
    assert rules.next_fire(every, due, due + timedelta(hours=2, minutes=30)) == due + timedelta(
        hours=3
    )
    assert rules.next_fire(rules.Schedule(at=due), due, due) is None
    daily = rules.Schedule(daily="09:00", tz="Europe/Paris")  # 07:00 UTC in October (CEST)
    assert rules.next_fire(daily, due, MONDAY_9) == datetime(2026, 10, 6, 7, tzinfo=UTC)


@pytest.mark.parametrize(
    ("ahead", "ok"),
    [
        (timedelta(minutes=14), False),
        (timedelta(minutes=15), True),
        (timedelta(days=7), True),
        (timedelta(days=7, minutes=1), False),
        (None, True),
    ],
)
def test_mute_limits(ahead: timedelta | None, ok: bool) -> None:
    until = None if ahead is None else MONDAY_9 + ahead
    if ok:
        rules.check_mute_until(until, MONDAY_9)
    else:
        with pytest.raises(ValueError):
            rules.check_mute_until(until, MONDAY_9)


@pytest.mark.parametrize("bad", ["Mars/Olympus", "+25:00", "nope nope"])
def test_unknown_zones_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        rules.zone_of(bad)


def test_notice_texts() -> None:
    assert rules.reminder_notice("alice", "check CI") == "Reminder from @alice: check CI"
    assert rules.task_notice("claimed", 3, "@bob") == "@bob claimed task #3."
    assert (
        rules.task_notice("status", 3, "User", detail="in_progress", note="add tests")
        == "User moved task #3 to in_progress: add tests"
    )
    assert rules.agent_status("running") == "replying"
    assert rules.agent_status("failed") == "error"
    assert rules.agent_status("interrupted") == "idle"
    assert rules.agent_status(None) == "idle"
