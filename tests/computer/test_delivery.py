"""Delivery at the edges (issue 10): a runner against `FakeCrewServer`, which keeps the contract.

Each test drives one edge: a superseded connection, a refused `crew reply`,
failures of the environment and of the content, a session the engine could not
keep, a server that does not answer, and the events lost at the end of a turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest

from computer_service.engine.base import (
    EngineEvent,
    EventSink,
    Failure,
    FailureClass,
    SessionPlan,
    StopSignal,
    TurnRequest,
    TurnResult,
)
from computer_service.gate import TurnGate
from computer_service.metrics import Metrics
from computer_service.runner import Runner
from computer_service.upstream import AgentRecord, UnreadRoom, Upstream
from crew_harness.waiting import wait_until_async
from crew_testkit.scripted import AT, ScriptedEngine, blocking, succeed
from tests.computer.fakes import FakeCrewServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

AGENT = "agent-ada"


@dataclass
class Workspace:
    """The agent's texts and session file, in memory: the input lists the message bodies."""

    @property
    def agents_md(self) -> str:
        return "# Ada"

    def repair(self) -> str | None:
        return None

    def render_input(self, rooms: list[UnreadRoom], new_session: bool) -> str:
        bodies = [str(m.model_dump().get("body")) for r in rooms for m in r.messages]
        return "\n".join(bodies)


@dataclass
class Setup:
    server: FakeCrewServer
    runner: Runner
    engine: ScriptedEngine
    workspace: Workspace
    rows: list[dict[str, Any]]
    superseded_calls: list[bool]

    def answered(self, count: int) -> bool:
        return sum(t.status == "succeeded" for t in self.server.finished_turns(AGENT)) >= count


@asynccontextmanager
async def running(
    engine: ScriptedEngine, *, workspace: Workspace | None = None
) -> AsyncIterator[Setup]:
    """One runner for agent `ada`, retrying after 10 ms, against a fresh fake server."""
    server = FakeCrewServer()
    upstream = Upstream("http://crew.test", "computer-token", transport=server.transport())
    await upstream.connect("test", "linux", "0", 1)
    agent = AgentRecord(id=AGENT, handle="ada", name="Ada", model="local/fake")
    rows: list[dict[str, Any]] = []
    superseded: list[bool] = []

    def publish(kind: str, data: dict[str, Any]) -> None:
        if kind == "state":
            rows.append(data)

    workspace = workspace or Workspace()
    runner = Runner(
        agent,
        upstream=upstream,
        engine=engine,
        workspace=workspace,
        gate=TurnGate(1),
        metrics=Metrics(),
        publish=publish,
        on_superseded=lambda: superseded.append(True),
        retry_base_s=0.01,
        retry_window_s=0.05,
    )
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run)
            yield Setup(server, runner, engine, workspace, rows, superseded)
            runner.close()
    finally:
        await upstream.aclose()


def failing(cls: FailureClass, reason: str, *, environment: bool = False) -> Any:
    async def behaviour(
        engine: ScriptedEngine, request: TurnRequest, on_event: EventSink, stop: StopSignal
    ) -> TurnResult:
        await on_event(EngineEvent("step_start", AT, {}))
        return TurnResult("failed", Failure(cls, reason, environment=environment))

    return behaviour


def crew_reply(exit_code: int, output: str) -> EngineEvent:
    """A bash tool call of `crew reply`, as `engine_event_of` gives it (exit in `facts`)."""
    data = {
        "tool": "bash",
        "title": "crew reply",
        "input": {"command": "crew reply dm-agent-ada <<'EOF'\nHello\nEOF"},
        "output": output,
        "duration_ms": 40,
        "failed": False,
    }
    return EngineEvent("tool_use", AT, data, facts={"exit": exit_code})


def replying(*exits: int) -> Any:
    """A turn whose agent runs `crew reply` once per exit status, then ends well."""

    async def behaviour(
        engine: ScriptedEngine, request: TurnRequest, on_event: EventSink, stop: StopSignal
    ) -> TurnResult:
        for code in exits:
            output = "Sent: message m9 in room r1." if code == 0 else "Error: token expired"
            await on_event(crew_reply(code, output))
        return await succeed(engine, request, on_event, stop)

    return behaviour


# --- 1. the connection epoch ---------------------------------------------------


async def test_every_request_after_connect_carries_the_epoch() -> None:
    async with running(ScriptedEngine()) as s:
        s.server.post(AGENT, "hello")
        s.runner.wake()
        await wait_until_async("1 answered", lambda: s.answered(1), 10)
        assert s.server.refused_epochs == []
        assert s.server.acks and s.server.unread(AGENT) == []


async def test_a_superseded_turn_stops_without_ack_and_tells_the_owner() -> None:
    release = anyio.Event()
    async with running(ScriptedEngine(script=[blocking(release)])) as s:
        s.server.post(AGENT, "are you there?")
        s.runner.wake()
        await s.engine.started.wait()
        s.server.supersede()  # the same token connected again elsewhere
        release.set()
        with anyio.fail_after(10):
            await s.runner.finished.wait()
        assert s.runner.superseded and not s.runner.fenced_out
        assert s.superseded_calls == [True]
        assert s.server.acks == []
        assert [m.body for m in s.server.unread(AGENT)] == ["are you there?"]
        # Not recorded either: the server marks it interrupted for the newer connection.
        assert [t.status for t in s.server.turns.values()] == ["running"]


async def test_a_superseded_claim_ends_the_runner_before_any_turn() -> None:
    async with running(ScriptedEngine()) as s:
        s.server.post(AGENT, "hello")
        s.server.supersede()
        s.runner.wake()
        with anyio.fail_after(10):
            await s.runner.finished.wait()
        assert s.runner.superseded and s.superseded_calls == [True]
        assert s.engine.inputs == [] and s.server.turns == {}


# --- 2. a refused `crew reply` ------------------------------------------------------


async def test_a_refused_reply_fails_the_turn_and_keeps_the_messages() -> None:
    engine = ScriptedEngine(script=[replying(1)])
    async with running(engine) as s:
        s.server.post(AGENT, "answer me")
        s.runner.wake()
        await wait_until_async("1 answered", lambda: s.answered(1), 10)
        first, second = s.server.finished_turns(AGENT)
        assert first.status == "failed"
        assert first.failure is not None and first.failure["class"] == "reply_refused"
        assert "token expired" in first.failure["reason"]
        # Not acked: the runner tried again by itself and answered the same message.
        assert len(s.server.acks) == 1 and s.server.acks[0]["turn_id"] == second.id
        assert engine.inputs == ["answer me", "answer me"]


async def test_a_reply_sent_after_a_refusal_counts_as_answered() -> None:
    async with running(ScriptedEngine(script=[replying(1, 0)])) as s:
        s.server.post(AGENT, "answer me")
        s.runner.wake()
        await wait_until_async("1 answered", lambda: s.answered(1), 10)
        [turn] = s.server.finished_turns(AGENT)
        assert turn.status == "succeeded" and len(s.server.acks) == 1


async def test_a_turn_failing_after_its_answer_went_out_is_acked_not_repeated() -> None:
    """The launcher was killed after `crew reply` got through: trying the turn again
    would answer the user twice (the storm benchmark saw it)."""

    async def answered_then_lost(
        engine: ScriptedEngine, request: TurnRequest, on_event: EventSink, stop: StopSignal
    ) -> TurnResult:
        await on_event(crew_reply(0, "Sent: message m9 in room r1."))
        lost = Failure(FailureClass.PROCESS_CRASHED, "the launcher was lost", environment=True)
        return TurnResult("failed", lost)

    engine = ScriptedEngine(script=[answered_then_lost])
    async with running(engine) as s:
        s.server.post(AGENT, "answer me")
        s.runner.wake()
        await wait_until_async("the ack", lambda: s.server.acks, 10)
        [turn] = s.server.finished_turns(AGENT)
        assert turn.status == "failed" and turn.failure is not None
        assert s.server.unread(AGENT) == []
        assert engine.inputs == ["answer me"]  # not run again
        assert all(row["retry_at"] is None for row in s.rows[-1:])


async def test_a_failed_turn_that_answered_only_some_rooms_is_not_acked() -> None:
    async def answered_elsewhere(
        engine: ScriptedEngine, request: TurnRequest, on_event: EventSink, stop: StopSignal
    ) -> TurnResult:
        event = crew_reply(0, "Sent.")
        event.data["input"] = {"command": "crew reply some-other-room <<'EOF'\nHi\nEOF"}
        await on_event(event)
        return TurnResult("failed", Failure(FailureClass.PROCESS_CRASHED, "crashed"))

    engine = ScriptedEngine(script=[answered_elsewhere])
    async with running(engine) as s:
        s.server.post(AGENT, "answer me")
        s.runner.wake()
        await wait_until_async("1 answered", lambda: s.answered(1), 10)
        first, second = s.server.finished_turns(AGENT)
        assert first.status == "failed" and second.status == "succeeded"
        assert engine.inputs == ["answer me", "answer me"]


# --- 3. environment and content failures -----------------------------------------


async def test_an_environment_failure_retries_by_itself_and_shows_why() -> None:
    limited = failing(FailureClass.RATE_LIMITED, "the model provider is rate limiting requests")
    async with running(ScriptedEngine(script=[limited, limited])) as s:
        s.server.post(AGENT, "hello")
        s.runner.wake()  # the only wake-up: the retries come from the runner itself
        await wait_until_async("1 answered", lambda: s.answered(1), 10)
        statuses = [t.status for t in s.server.finished_turns(AGENT)]
        assert statuses == ["failed", "failed", "succeeded"]
        # The whole claim each time (nothing narrowed), and nothing set aside.
        assert [max_messages for _, max_messages, _ in s.server.claims] == [None, None, None]
        assert s.server.notices == []
        waiting = [row for row in s.rows if row["retry_at"] is not None]
        assert waiting and waiting[0]["last_reason"].startswith("the model provider is rate")


async def test_a_message_that_always_fails_is_set_aside_and_newer_ones_flow() -> None:
    async def poisoned(
        engine: ScriptedEngine, request: TurnRequest, on_event: EventSink, stop: StopSignal
    ) -> TurnResult:
        if "poison" in request.render_input(request.plan.is_new):
            crash = failing(FailureClass.PROCESS_CRASHED, "OpenCode was killed by signal 9")
            result: TurnResult = await crash(engine, request, on_event, stop)
            return result
        return await succeed(engine, request, on_event, stop)

    engine = ScriptedEngine(default=poisoned)
    async with running(engine) as s:
        s.server.post(AGENT, "poison")
        s.server.post(AGENT, "second")
        s.server.post(AGENT, "third")
        s.runner.wake()
        await wait_until_async("1 answered", lambda: s.answered(1), 10)
        claims = [(max_messages, len(ids)) for _, max_messages, ids in s.server.claims]
        assert claims[:4] == [(None, 3), (1, 1), (1, 1), (None, 2)]
        statuses = [t.status for t in s.server.finished_turns(AGENT)]
        assert statuses == ["failed", "failed", "failed", "succeeded"]
        set_aside = [a for a in s.server.acks if "set_aside" in a]
        assert len(set_aside) == 1
        assert "process_crashed" in set_aside[0]["set_aside"]["reason"]
        [(room, notice)] = s.server.notices
        assert room == f"dm-{AGENT}"
        assert notice.startswith("@ada could not handle 1 message(s), and set them aside")
        assert engine.inputs[-1] == "second\nthird"
        assert s.server.unread(AGENT) == []


async def test_a_success_forgets_the_strikes() -> None:
    crash = failing(FailureClass.ENGINE_ERROR, "boom")
    # Two failures on the message, a success, then two more on the next: nothing set aside.
    engine = ScriptedEngine(script=[crash, crash, succeed, crash, crash])
    async with running(engine) as s:
        s.server.post(AGENT, "one")
        s.runner.wake()
        await wait_until_async("1 answered", lambda: s.answered(1), 10)
        s.server.post(AGENT, "two")
        s.runner.wake()
        await wait_until_async("2 answered", lambda: s.answered(2), 10)
        assert s.server.notices == []
        assert [a for a in s.server.acks if "set_aside" in a] == []
        # The success also ended the narrowing: the next claim took everything unread.
        assert [max_messages for _, max_messages, _ in s.server.claims] == [None, 1, 1, None, 1, 1]


# --- 4. a session the engine could not keep ---------------------------------------


async def test_a_session_the_engine_could_not_keep_still_acks() -> None:
    """The engine (`engine/session.py`) lost the session: the reply went out, so the turn
    succeeds and is acked; the row shows no session, as the next turn starts anew."""

    class Continuing(ScriptedEngine):
        def plan_session(self, agent_id: str, model: str, agents_md: str) -> SessionPlan:
            return SessionPlan("ses-earlier")

    async def lost(engine: ScriptedEngine, request: Any, on_event: Any, stop: Any) -> Any:
        result = await succeed(engine, request, on_event, stop)
        result.session_id = None
        return result

    async with running(Continuing(script=[lost])) as s:
        s.server.post(AGENT, "first")
        s.runner.wake()
        await wait_until_async("1 answered", lambda: s.answered(1), 10)
        assert s.server.unread(AGENT) == [] and s.runner.session_id is None
        [first] = s.server.finished_turns(AGENT)
        assert first.session_id == "ses-earlier"


# --- 5. the server or the launcher away -------------------------------------------


@pytest.mark.parametrize(
    "operation, fault",
    [
        ("unread", 503),
        ("unread", httpx.ConnectError("connection refused")),
        ("turns", 502),
        ("turns", httpx.ConnectError("connection refused")),
    ],
    ids=["claim-5xx", "claim-unreachable", "register-5xx", "register-unreachable"],
)
async def test_a_claim_or_registration_that_fails_is_tried_again_by_itself(
    operation: str, fault: Any
) -> None:
    async with running(ScriptedEngine()) as s:
        s.server.faults[operation] = [fault, fault]
        s.server.post(AGENT, "hello")
        s.runner.wake()
        await wait_until_async("1 answered", lambda: s.answered(1), 10)
        assert s.server.faults[operation] == []
        assert s.engine.inputs == ["hello"]


async def test_an_ack_failing_past_the_window_is_tried_again_with_the_same_messages() -> None:
    async with running(ScriptedEngine()) as s:
        s.server.faults["ack"] = [503]
        s.server.post(AGENT, "hello")
        s.runner.wake()
        await wait_until_async("1 answered", lambda: s.answered(1), 10)
        first, second = s.server.finished_turns(AGENT)
        assert first.status == "failed" and second.status == "succeeded"
        # At least once: the answer is repeated, never lost. No strike for the message.
        assert s.engine.inputs == ["hello", "hello"]
        assert [max_messages for _, max_messages, _ in s.server.claims] == [None, None]


async def test_a_launcher_lost_mid_turn_is_tried_again_by_itself() -> None:
    lost = failing(
        FailureClass.PROCESS_CRASHED,
        "the sandbox launcher was lost: connection refused",
        environment=True,
    )
    async with running(ScriptedEngine(script=[lost, lost, lost])) as s:
        s.server.post(AGENT, "hello")
        s.runner.wake()
        await wait_until_async("1 answered", lambda: s.answered(1), 10)
        assert len(s.engine.inputs) == 4 and s.server.notices == []
        assert [max_messages for _, max_messages, _ in s.server.claims] == [None] * 4


# --- 6. events lost at the end of a turn --------------------------------------------


async def test_the_finish_counts_the_events_the_server_never_got() -> None:
    async with running(ScriptedEngine()) as s:
        s.server.faults["events"] = [503] * 3
        s.server.post(AGENT, "hello")
        s.runner.wake()
        await wait_until_async("1 answered", lambda: s.answered(1), 10)
        [turn] = s.server.finished_turns(AGENT)
        assert turn.event_count == 3
        assert turn.gaps == [(0, 3)]
