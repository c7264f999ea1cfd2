"""A person's Stop and Wake on the Computer (issue 25): a runner against `FakeCrewServer`.

A `stop` names its turn: only that turn, while it runs, is cancelled (a late one does
nothing); a stopped turn is not retried by itself; a `wake` with `now` runs a turn
even inside a retry's backoff — the provider's own time included. The stream's
events reach the roster with what they carry.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from httpx_sse import ServerSentEvent

from computer_service.engine.base import Failure, FailureClass, TurnResult
from computer_service.event_stream import EventStream
from computer_service.gate import TurnGate
from computer_service.metrics import Metrics
from computer_service.roster import Roster
from computer_service.upstream import UnreadRoom
from crew_harness.waiting import wait_until_async
from crew_testkit.scripted import ScriptedEngine, wait_for_stop
from tests.computer.test_delivery import AGENT, Workspace, running

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def test_a_stop_for_another_turn_stops_nothing_then_its_own_stops_it() -> None:
    engine = ScriptedEngine(script=[wait_for_stop])
    async with running(engine) as s:
        s.server.post(AGENT, "the long job")
        s.runner.wake()
        await engine.started.wait()
        turn_id = s.runner.current_turn_id
        assert turn_id is not None
        assert not s.runner.stop_turn_of("turn-older")  # late, for a turn long over
        assert s.runner.state == "running" and s.server.finished_turns(AGENT) == []
        assert s.runner.stop_turn_of(turn_id)
        await wait_until_async("the turn ended", lambda: s.server.finished_turns(AGENT), 10)
        [turn] = s.server.finished_turns(AGENT)
        assert turn.status == "cancelled"
        # Not acked, and not retried by itself: idle until a new message or a Wake.
        await wait_until_async("idle", lambda: s.runner.state == "idle")
        assert s.runner.retry_at is None and not s.runner.pending_wake
        assert not s.runner.stop_turn_of(turn_id)  # a second stop for it: over already
        s.runner.wake(now=True)
        await wait_until_async("answered", lambda: s.answered(1), 10)
        assert engine.inputs == ["the long job", "the long job"]


async def test_a_wake_from_before_the_stop_starts_no_turn_one_after_it_does() -> None:
    # The server's wake for the message the turn had already claimed came during the
    # turn (a new runner claims before its wake arrives): after a Stop it must not run
    # the stopped message again by itself. A wake after the stop is a new message's.
    engine = ScriptedEngine(script=[wait_for_stop, wait_for_stop])
    async with running(engine) as s:
        s.server.post(AGENT, "the long job")
        s.runner.wake()
        await engine.started.wait()
        s.runner.wake()  # merged into "one next turn" while the turn runs
        turn_id = s.runner.current_turn_id
        assert turn_id is not None and s.runner.pending_wake
        assert s.runner.stop_turn_of(turn_id)
        await wait_until_async("the turn ended", lambda: s.server.finished_turns(AGENT), 10)
        await wait_until_async("idle", lambda: s.runner.state == "idle")
        assert not s.runner.pending_wake and len(engine.inputs) == 1
        s.server.post(AGENT, "a new message")
        s.runner.wake()
        await wait_until_async("a second turn", lambda: len(engine.inputs) == 2, 10)


class StopWhileRegistering(Workspace):
    """Sends the person's Stop for the first turn while it is being registered (the
    stream's `stop` can come before the registration's answer)."""

    def __init__(self) -> None:
        self.runner: Any = None
        self.asked: list[bool] = []

    def render_input(self, rooms: list[UnreadRoom], new_session: bool) -> str:
        if not self.asked:
            self.asked.append(self.runner.stop_turn_of("turn-1"))  # the fake's first id
        return super().render_input(rooms, new_session)


async def test_a_stop_before_the_registration_answer_still_stops_that_turn() -> None:
    workspace = StopWhileRegistering()
    engine = ScriptedEngine(script=[wait_for_stop])
    async with running(engine, workspace=workspace) as s:
        workspace.runner = s.runner
        s.server.post(AGENT, "stop me early")
        s.runner.wake()
        await wait_until_async("the turn ended", lambda: s.server.finished_turns(AGENT), 10)
        assert workspace.asked == [True]
        [turn] = s.server.finished_turns(AGENT)
        assert (turn.id, turn.status) == ("turn-1", "cancelled")


async def test_a_persons_wake_runs_inside_the_providers_retry_time() -> None:
    async def limited(engine: ScriptedEngine, request: Any, on_event: Any, stop: Any) -> Any:
        failure = Failure(FailureClass.RATE_LIMITED, "rate limited", retry_after_s=3600.0)
        return TurnResult("failed", failure)

    async with running(ScriptedEngine(script=[limited])) as s:
        s.server.post(AGENT, "hello")
        s.runner.wake()
        await wait_until_async("the retry time", lambda: s.runner.retry_at is not None, 10)
        s.runner.wake(now=True)  # an hour early: only a person's Wake may
        await wait_until_async("answered", lambda: s.answered(1), 10)
        assert [t.status for t in s.server.finished_turns(AGENT)] == ["failed", "succeeded"]


class RecordingRoster:
    """What the stream hands the roster, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def wake_from_server(self, agent_id: str, *, now: bool = False) -> None:
        self.calls.append(("wake", agent_id, now))

    def stop_from_server(self, agent_id: str, turn_id: str) -> None:
        self.calls.append(("stop", agent_id, turn_id))


@pytest.mark.parametrize(
    ("event", "data", "call"),
    [
        ("wake", {"agent_id": "a1"}, ("wake", "a1", False)),
        ("wake", {"agent_id": "a1", "now": True}, ("wake", "a1", True)),
        ("wake", {"agent_id": "a1", "now": "yes"}, ("wake", "a1", False)),
        ("stop", {"agent_id": "a1", "turn_id": "t1"}, ("stop", "a1", "t1")),
        ("stop", {"agent_id": "a1"}, None),
        ("stop", {"turn_id": "t1"}, None),
        ("stop", ["a1", "t1"], None),
    ],
)
async def test_the_stream_hands_wake_and_stop_to_the_roster(
    event: str, data: Any, call: tuple[Any, ...] | None
) -> None:
    roster = RecordingRoster()
    stream = EventStream(None, roster, fail=lambda reason: None)  # type: ignore[arg-type]
    await stream._on_event(ServerSentEvent(event=event, data=orjson.dumps(data).decode()))
    assert roster.calls == ([call] if call is not None else [])


async def test_the_roster_stops_only_the_named_running_turn() -> None:
    engine = ScriptedEngine(script=[wait_for_stop])
    async with running(engine) as s:
        # Only its runners are used here: the runner of the test, as if synced.
        roster = Roster(
            s.runner._upstream,
            None,  # type: ignore[arg-type]
            gate=TurnGate(1),
            metrics=Metrics(),
            publish=lambda kind, data: None,
        )
        roster.runners = {AGENT: s.runner}
        s.server.post(AGENT, "the long job")
        s.runner.wake()
        await engine.started.wait()
        roster.stop_from_server(AGENT, "turn-0")
        roster.stop_from_server("agent-unknown", "turn-1")
        assert s.runner.state == "running"  # a stop sets `stopping` at once: none came
        roster.stop_from_server(AGENT, str(s.runner.current_turn_id))
        await wait_until_async("the turn ended", lambda: s.server.finished_turns(AGENT), 10)
        assert s.server.finished_turns(AGENT)[0].status == "cancelled"
