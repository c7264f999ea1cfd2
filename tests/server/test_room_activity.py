"""The room's status line in the store (issue 25): the running turn found for its room,
with the step it is at; a failure line that collapses retries; dismissal, and a new
failure after it; a success that clears. On SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from crew_server.clock import Clock
from crew_server.errors import Invalid
from crew_server.store import Store
from crew_server.store.room_activity import current_step
from tests.server.conftest import START

NOT_LOGGED_IN = {"class": "not_logged_in", "reason": "no login. Run `opencode auth login`."}


@dataclass
class Room:
    """A store with @ada on a connected Computer, her dm and a group she is in."""

    store: Store
    computer_id: str
    ada: dict[str, Any]
    dm: dict[str, Any]
    group: dict[str, Any]

    def turn(self, room: dict[str, Any]) -> dict[str, Any]:
        """A turn of @ada given a new message of `room` (running)."""
        message = self.store.user_post(room["id"], "hello", None)
        served = [{"room_id": room["id"], "from_seq": message["seq"], "to_seq": message["seq"]}]
        return self.store.register_turn(
            self.computer_id, self.ada["id"], served, "x", "opencode", "m/x", None
        )

    def events(self, turn: dict[str, Any], first: int, *events: tuple[str, dict[str, Any]]) -> None:
        rows = [
            {
                "type": kind,
                "at": "2026-10-05T09:00:00+00:00",
                "data_json": orjson.dumps(data).decode(),
            }
            for kind, data in events
        ]
        self.store.add_events(self.computer_id, turn["turn_id"], turn["fence"], first, rows)

    def end(self, turn: dict[str, Any], status: str = "succeeded") -> None:
        failure = NOT_LOGGED_IN if status == "failed" else None
        self.store.finish_turn(
            self.computer_id, turn["turn_id"], turn["fence"], status, failure, None
        )

    def failures(self, room: dict[str, Any]) -> list[dict[str, Any]]:
        return self.store.room_activity(room["id"])["failures"]


@pytest.fixture
def room(store_location: str) -> Iterator[Room]:
    store = Store(store_location, Clock(START))
    computer_id, _ = store.create_computer("box")
    store.connect(computer_id, "h", "linux", "1", 1)
    ada = store.create_agent("ada", "Ada", "", "m/x", "opencode", computer_id)
    bo = store.create_agent("bo", "Bo", "", "m/x", "opencode", computer_id)
    dm, _ = store.create_room("dm", None, [ada["id"]])
    group, _ = store.create_room("group", "ops", [ada["id"], bo["id"]])
    yield Room(store, computer_id, ada, dm, group)
    store.close()


def test_the_running_turn_shows_in_its_room_with_its_step_and_goes_at_its_end(
    room: Room,
) -> None:
    turn = room.turn(room.dm)
    [working] = room.store.room_activity(room.dm["id"])["working"]
    assert (working["handle"], working["turn_id"], working["doing"]) == (
        "ada",
        turn["turn_id"],
        "starting",
    )
    # Only the room the turn serves: the group, where she is a member too, shows nothing.
    assert room.store.room_activity(room.group["id"])["working"] == []
    command = {"command": "npm install", "description": "Install"}
    room.events(
        turn,
        0,
        ("step_start", {}),
        ("tool_start", {"call_id": "c1", "tool": "bash", "input": command, "title": None}),
    )
    [working] = room.store.room_activity(room.dm["id"])["working"]
    assert (working["doing"], working["tool"], working["detail"]) == (
        "running",
        "bash",
        "npm install",
    )
    room.events(turn, 2, ("tool_use", {"call_id": "c1", "tool": "bash"}), ("text", {"text": "Do"}))
    assert room.store.room_activity(room.dm["id"])["working"][0]["doing"] == "writing"
    room.end(turn)
    assert room.store.room_activity(room.dm["id"]) == {"working": [], "failures": []}


def test_the_step_of_a_turn_from_its_newest_events() -> None:
    def step(*events: tuple[str, dict[str, Any]]) -> tuple[Any, ...]:
        found = current_step([{"type": k, "data": d} for k, d in reversed(events)])
        return found["doing"], found["tool"], found["detail"]

    assert step() == ("starting", None, None)
    assert step(("step_start", {})) == ("thinking", None, None)
    assert step(("reasoning", {"text": "hm"})) == ("thinking", None, None)
    assert step(("tool_start", {"call_id": "a", "tool": "read", "title": "app.py"})) == (
        "running",
        "read",
        "app.py",
    )
    # Finished (its tool_use came): the model thinks about the result.
    finished = (("tool_start", {"call_id": "a", "tool": "bash"}), ("tool_use", {"call_id": "a"}))
    assert step(*finished) == ("thinking", None, None)
    long = "x" * 200 + "\nsecond line"
    _, _, detail = step(
        ("tool_start", {"call_id": "b", "tool": "bash", "input": {"command": long}})
    )
    assert detail is not None and len(detail) == 80 and detail.endswith("…")
    assert step(("approval_asked", {"tool": "bash", "summary": "push"}))[0] == "waiting"
    answered = (("approval_asked", {"tool": "bash"}), ("approval_answered", {"state": "allowed"}))
    assert step(*answered)[0] == "thinking"


def test_retries_make_one_line_that_counts_them_and_a_success_clears_it(room: Room) -> None:
    turns = []
    for _ in range(3):
        turns.append(room.turn(room.dm))
        room.end(turns[-1], "failed")
    [line] = room.failures(room.dm)
    assert (line["handle"], line["count"], line["turn_id"]) == ("ada", 3, turns[-1]["turn_id"])
    assert (line["class"], line["reason"]) == ("not_logged_in", NOT_LOGGED_IN["reason"])
    assert line["last_at"]
    assert room.failures(room.group) == []  # her turns failed in the dm only
    # A turn for another room neither counts nor clears.
    other = room.turn(room.group)
    room.end(other)
    assert room.failures(room.dm)[0]["count"] == 3
    # Cancelled: not a failure, not an answer.
    cancelled = room.turn(room.dm)
    room.end(cancelled, "cancelled")
    assert room.failures(room.dm)[0]["count"] == 3
    room.end(room.turn(room.dm))
    assert room.failures(room.dm) == []


def test_a_dismissed_line_stays_away_until_a_new_failure(room: Room) -> None:
    first = room.turn(room.dm)
    room.end(first, "failed")
    second = room.turn(room.dm)
    room.end(second, "failed")
    room.store.dismiss_room_failure(room.dm["id"], room.ada["id"], second["turn_id"])
    assert room.failures(room.dm) == []  # stored: every later read sees it dismissed
    third = room.turn(room.dm)
    room.end(third, "failed")
    [line] = room.failures(room.dm)
    assert (line["count"], line["turn_id"]) == (1, third["turn_id"])


def test_only_a_failed_turn_of_the_agent_for_the_room_can_be_dismissed(room: Room) -> None:
    ok = room.turn(room.dm)
    room.end(ok)
    with pytest.raises(Invalid, match="not a failed turn for this room"):
        room.store.dismiss_room_failure(room.dm["id"], room.ada["id"], ok["turn_id"])
    failed = room.turn(room.dm)
    room.end(failed, "failed")
    with pytest.raises(Invalid, match="not a failed turn for this room"):
        room.store.dismiss_room_failure(room.group["id"], room.ada["id"], failed["turn_id"])
    bo = next(a for a in room.store.list_agents() if a["handle"] == "bo")
    with pytest.raises(Invalid, match="is not a turn of agent"):
        room.store.dismiss_room_failure(room.dm["id"], bo["id"], failed["turn_id"])
