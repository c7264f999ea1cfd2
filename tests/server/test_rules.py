"""Table tests of the pure rules: mentions, who is woken, schedules, mute limits, notices."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from crew_server import rules
from crew_server.clock import Clock

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


def step(**data: object) -> dict[str, object]:
    return {"type": "step_finish", "data": data}


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([], {}),
        (
            [
                step(tokens={"input": 3, "output": 4}, cost=0.5),
                step(tokens={"input": 1}, cost=0.25),
            ],
            {"input_tokens": 4, "output_tokens": 4, "cost": 0.75},
        ),
        ([{"type": "text", "data": {"tokens": {"input": 9}, "cost": 1}}], {}),
        ([step(tokens={"input": True, "output": "5", "reasoning": -1}, cost=float("nan"))], {}),
        ([step(tokens={"cache_read": 2**60}, cost=1e300)], {}),  # beyond the bounds: not summed
        (
            [step(tokens={"input": 2**53}), step(tokens={"input": 2**53})],
            {"input_tokens": 2**53},  # the total stops at the bound
        ),
        ([step(tokens=[1, 2], cost=None), {"type": "step_finish", "data": "x"}], {}),
    ],
)
def test_usage_totals_from_step_finish_events(
    events: list[dict[str, object]], expected: dict[str, float]
) -> None:
    zero = dict.fromkeys(
        ("input_tokens", "output_tokens", "reasoning_tokens", "cache_read", "cache_write"), 0
    )
    assert rules.usage_from_events(events) == {**zero, "cost": 0.0, **expected}


def test_the_clock_moves_forward_only_and_stays_within_four_digit_years() -> None:
    clock = Clock(datetime(8999, 6, 1, tzinfo=UTC))
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="year 9000"):
        clock.advance(2 * 366 * 86_400)
    assert clock.now() == datetime(8999, 6, 1, tzinfo=UTC)  # unchanged by the refusals
    assert clock.advance(60) == datetime(8999, 6, 1, 0, 1, tzinfo=UTC)
