"""One serial `Runner` per agent (the `TurnGate` in `gate.py` caps concurrent turns).

A runner sleeps until woken, then runs one turn (computer.md §2): claim the
unread messages, build the input, register the turn, run the engine with a
`RunReporter`, then ack and finish — or finish as failed/cancelled without ack.
Wake-ups during a turn merge into ONE next turn. After a failure the runner
wakes itself again with backoff, narrows its claim to a message that keeps
failing and sets that one aside at last (`delivery.Retries`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum, StrEnum
from typing import Any, Literal, Protocol, TypeVar

import anyio

from computer_service.capabilities_report import CapabilitiesReport
from computer_service.delivery import RETRY_BASE_S, RETRY_WINDOW_S, NextStep, Retries
from computer_service.engine.base import (
    Engine,
    EngineEvent,
    Failure,
    FailureClass,
    TurnRequest,
    TurnResult,
    Usage,
)
from computer_service.engine.failures import ReplyAttempts, set_aside_reason
from computer_service.gate import TurnGate
from computer_service.metrics import Metrics
from computer_service.reporter import RunReporter
from computer_service.turn_identity import TurnIdentityFile
from computer_service.turn_trace import TurnTrace, epoch_ms_of, now_ms
from computer_service.upstream import (
    AgentRecord,
    ClaimedRooms,
    RegisteredTurn,
    StaleTurn,
    Superseded,
    TurnApprovals,
    TurnRoom,
    UnreadRoom,
    Upstream,
    UpstreamError,
    UpstreamRejected,
    UpstreamUnavailable,
)

log = logging.getLogger(__name__)

# The last report of a stopped turn may still go out, but never hold up a stop for long.
FINISH_TIMEOUT_S = 8.0
RECENT_TURNS = 20
# The wall-clock limit of one turn unless the bootstrap says otherwise (computer.md §3).
DEFAULT_TURN_TIME_LIMIT_S = 30 * 60

Publish = Callable[[str, dict[str, Any]], None]
TurnStatus = Literal["succeeded", "failed", "cancelled"]
T = TypeVar("T")


class Gone(Enum):
    """What `Runner._or_gone` returns when the server says the agent is no longer ours."""

    GONE = "gone"


GONE = Gone.GONE


class RunnerState(StrEnum):
    """What a runner is doing, as introspection shows it."""

    IDLE = "idle"
    QUEUED = "queued"
    RUNNING = "running"
    STOPPING = "stopping"
    PROBLEM = "problem"


class AgentWorkspace(Protocol):
    """What a runner needs from the agent's files and texts (home + texts modules)."""

    @property
    def agents_md(self) -> str:
        """The AGENTS.md text written for this runner (its digest decides the session)."""
        ...

    def repair(self) -> str | None:
        """Before a turn: check the directories, recreate what the Computer owns.

        None when the turn can go on; else why it cannot and what to do.
        """
        ...

    def render_input(self, rooms: list[UnreadRoom], new_session: bool) -> str:
        """The turn input for these unread rooms (texts.md)."""
        ...


@dataclass
class TurnRecord:
    """One finished turn, as `GET /agents/{id}` shows it."""

    id: str
    status: str
    duration_ms: int
    input_tokens: int
    output_tokens: int
    cost: float
    failure_class: str | None
    reason: str | None
    # Where its time went (turn_trace.py): step → epoch ms.
    trace: dict[str, int] = field(default_factory=dict)


@dataclass
class Outcome:
    """How one registered turn ended, before it is recorded upstream."""

    status: TurnStatus
    failure: Failure | None = None
    usage: Usage = field(default_factory=Usage)
    event_count: int = 0
    # Failed, but its answers had gone out: acked, not to be tried again.
    acked: bool = False
    # The input the engine got when it is not the registered one (a new session's).
    engine_input: str | None = None


class Runner:
    """The serial turn loop of one agent. The service owns the task running `run()`.

    `on_superseded` is called once when the server says another Computer
    connected with this Computer's token: the runner has stopped without ack
    (`superseded` is set) and the whole Computer must stop.
    """

    def __init__(
        self,
        agent: AgentRecord,
        *,
        upstream: Upstream,
        engine: Engine,
        workspace: AgentWorkspace,
        gate: TurnGate,
        metrics: Metrics,
        publish: Publish = lambda kind, data: None,
        wall_clock_limit_s: float = DEFAULT_TURN_TIME_LIMIT_S,
        on_superseded: Callable[[], None] = lambda: None,
        retry_base_s: float = RETRY_BASE_S,
        retry_window_s: float = RETRY_WINDOW_S,
        turn_identity: TurnIdentityFile | None = None,
    ) -> None:
        self.agent = agent
        # Where each turn's identity goes for its `crew` (None: nowhere, as in tests).
        self._turn_identity = turn_identity
        self._upstream = upstream
        self._engine = engine
        self._capabilities = CapabilitiesReport()
        self._workspace = workspace
        self._gate = gate
        self._metrics = metrics
        self._publish = publish
        self._wall_clock_limit_s = wall_clock_limit_s
        self.state = RunnerState.IDLE
        self.current_turn_id: str | None = None
        self.turn_started_at: str | None = None
        self.pending_wake = False
        self.last_result: str | None = None
        self.last_reason: str | None = None
        self.session_id: str | None = None
        self.fenced_out = False
        self.superseded = False
        # Why this agent cannot run any more (the workspace could not be repaired).
        self.problem: str | None = None
        # Why the server handed out no turn at the last claim, and until when (its budget);
        # the server wakes the agent when that ends: no retry of ours.
        self.held: str | None = None
        self._on_superseded = on_superseded
        self._retries = Retries(base_s=retry_base_s)
        self._retry_window_s = retry_window_s
        # When the runner wakes itself again (None: only when woken), and that time for the row.
        self._retry_in: float | None = None
        self.retry_at: str | None = None
        # The retry is the provider's own time (a rate limit's Retry-After): wakes wait for it.
        self._retry_firm = False
        self.recent: deque[TurnRecord] = deque(maxlen=RECENT_TURNS)
        self._woken = anyio.Event()
        # When the first wake-up for the next turn came (epoch ms; its trace's `wake`).
        self._woken_at_ms: int | None = None
        # Where the current turn's time goes (turn_trace.py); a new one per turn.
        self.trace = TurnTrace()
        # A person's Wake: the next sleep ends at once, a firm retry time too.
        self._wake_now = False
        # A stop for the turn being registered now (`stop_turn_of`).
        self._stop_asked: str | None = None
        self._stop: anyio.Event | None = None
        self._reporter: RunReporter | None = None
        self._closing = False
        self.finished = anyio.Event()

    # Control, from the service and the introspection API.

    def wake(self, *, now: bool = False) -> None:
        """Ask for a turn; wakes during a turn merge into one next turn.

        `now` (a person's Wake): also past a retry's backoff, the provider's own time
        (a rate limit's Retry-After) included; the backoff's count stays.
        """
        if self._closing:
            return
        if now:
            self._wake_now = True
        if self._woken_at_ms is None:
            self._woken_at_ms = now_ms()
        self.pending_wake = True
        self._woken.set()
        self._changed()

    def stop_turn(self) -> bool:
        """Stop the current turn (it ends as cancelled, no ack). False when none is running."""
        if self._stop is None or self._stop.is_set():
            return False
        self._stop.set()
        if self.state is RunnerState.RUNNING:
            self.state = RunnerState.STOPPING
            self._changed()
        return True

    def stop_turn_of(self, turn_id: str) -> bool:
        """A person's Stop for `turn_id`: stop the current turn only if it is that one.

        Right after registering, before the answer named the turn here, the stop is
        kept for it (`_stop_asked`). False: `turn_id` is not running here (it ended, or
        the stop came late), and nothing is stopped.
        """
        if self.current_turn_id == turn_id:
            stopped = self.stop_turn()
        elif self.current_turn_id is None and self.state is RunnerState.RUNNING:
            self._stop_asked = turn_id
            stopped = True
        else:
            return False
        if stopped:
            self._forget_earlier_wakes()
        return stopped

    def _forget_earlier_wakes(self) -> None:
        """A person stopped the turn: the wake-ups that came before are for the messages
        it stopped on (the server's wake for a message the turn had already claimed), so
        none may start the next turn: the messages wait unread until a person's Wake or
        a wake-up that comes after the stop (a new message). Nothing is lost: they stay
        unread on the server."""
        if not self._wake_now:
            self.pending_wake = False
            self._woken_at_ms = None
            self._woken = anyio.Event()

    def close(self) -> None:
        """End the loop: stop the current turn; `run()` returns once it is recorded."""
        self._closing = True
        self.stop_turn()
        if self._reporter is not None:
            self._reporter.abandon()  # a stop does not wait for an unreachable server
        self._woken.set()

    # The loop.

    async def run(self) -> None:
        """Sleep until woken, run one turn, repeat.

        Returns on `close()`, fenced out, superseded, or a `problem`.
        """
        try:
            while not self._closing and not self._gone and self.problem is None:
                await self._sleep()
                if self._closing:
                    break
                self._woken = anyio.Event()
                self.pending_wake = False
                self.trace = TurnTrace()
                if self._woken_at_ms is not None:
                    self.trace.mark("wake", self._woken_at_ms)
                    self._woken_at_ms = None
                try:
                    await self._turn()
                except Exception:
                    # A bug in one turn must not end the agent's runner.
                    log.exception(
                        "agent %s: turn crashed; waiting for the next wake-up", self.agent.handle
                    )
                finally:
                    self.current_turn_id = None
                    self.turn_started_at = None
                    self._stop = None
                    self._stop_asked = None
                    self._set_state(RunnerState.IDLE)
        finally:
            self.finished.set()

    @property
    def wall_clock_limit_s(self) -> float:
        """The limit of this agent's next turn: its own when the server gives one, else
        the Computer's (bootstrap `turn_time_limit_s`)."""
        return self.agent.turn_time_limit_s or self._wall_clock_limit_s

    def update_agent(self, agent: AgentRecord) -> None:
        """The server's record of this agent changed in what needs no new runner (its
        `settings()` are the same): later turns use it (e.g. its time limit)."""
        assert agent.settings() == self.agent.settings(), "a new runner is needed"
        self.agent = agent

    @property
    def _gone(self) -> bool:
        """Another Computer (or connection) owns the agent: nothing more may be written."""
        return self.fenced_out or self.superseded

    async def _sleep(self) -> None:
        """Until woken, or until the retry a failure asked for is due."""
        if self._retry_in is None:
            await self._woken.wait()
        elif self._retry_firm:
            # No turn before the provider's time: the model would refuse it. A wake now
            # (a new message) merges into the turn then; only a close or a person's Wake
            # ends the wait.
            until = time.monotonic() + self._retry_in
            while (
                not self._closing and not self._wake_now and (left := until - time.monotonic()) > 0
            ):
                with anyio.move_on_after(left):
                    await self._woken.wait()
                self._woken = anyio.Event()
        else:
            with anyio.move_on_after(self._retry_in):
                await self._woken.wait()
        if self._wake_now:
            log.info("agent %s: woken by a person; running a turn now", self.agent.handle)
        self._wake_now = False
        self._retry_in = None
        self._retry_firm = False
        self.retry_at = None

    def _retry_later(self, delay_s: float | None, *, firm: bool = False) -> None:
        """Wake by itself after `delay_s` (None: only when woken; `firm`: not before it)."""
        self._retry_in = delay_s
        self._retry_firm = firm and delay_s is not None
        if delay_s is None:
            self.retry_at = None
        else:
            at = datetime.now(UTC) + timedelta(seconds=delay_s)
            self.retry_at = at.isoformat(timespec="seconds")
        self._changed()

    def _note_hold(self, rooms: list[UnreadRoom]) -> None:
        """Keep (and log when it starts or changes) why the server holds the agent's turns."""
        paused = rooms.paused if isinstance(rooms, ClaimedRooms) else None
        held = paused.text() if paused is not None else None
        if held != self.held:
            if held is not None:
                log.info("agent %s: no turn now, held by the server: %s", self.agent.handle, held)
            else:
                log.info("agent %s: no longer held by the server", self.agent.handle)
            self.held = held
            self._changed()

    def _unreachable(self, what: str, exc: Exception) -> None:
        """A claim or a registration failed: nothing ran; try again with backoff."""
        delay = self._retries.next_delay()
        self.last_reason = f"{what} failed: {exc}"[:500]
        log.warning(
            "agent %s: %s; trying again in %.0f s", self.agent.handle, self.last_reason, delay
        )
        self._retry_later(delay)

    async def _turn(self) -> None:
        stop = anyio.Event()
        self._stop = stop
        self._set_state(RunnerState.QUEUED)
        async with self._gate.slot(abort=stop) as held:
            if not held or stop.is_set():
                return
            # Just before claiming (not before the wait for a slot, when the home can
            # still change): a broken directory would fail every turn, and the messages.
            problem = self._workspace.repair()
            if problem is not None:
                log.warning("agent %s cannot run: %s", self.agent.handle, problem)
                self.problem = problem
                return
            self._set_state(RunnerState.RUNNING)
            started = time.monotonic()
            try:
                rooms = await self._or_gone(
                    self._upstream.claim_unread(
                        self.agent.id, max_messages=self._retries.max_messages
                    )
                )
            except UpstreamError as exc:
                self._unreachable("claiming unread messages", exc)
                return
            if rooms is GONE:
                return
            self.trace.mark("claimed")
            self._note_hold(rooms)
            if not rooms:
                self._retries.forget()
                return
            if stop.is_set():
                log.info(
                    "agent %s: stopped while claiming; the turn is not started", self.agent.handle
                )
                return
            await self._run_claimed(rooms, stop, started)

    async def _run_claimed(
        self, rooms: list[UnreadRoom], stop: anyio.Event, started: float
    ) -> None:
        agent = self.agent
        posted = [
            at
            for r in rooms
            for m in r.messages
            if (at := epoch_ms_of((m.model_extra or {}).get("created_at"))) is not None
        ]
        if posted:
            self.trace.mark("post", max(posted))
        plan = self._engine.plan_session(agent.id, agent.model, self._workspace.agents_md)
        turn_input = self._workspace.render_input(rooms, plan.is_new)
        turn_rooms = [
            TurnRoom(room_id=r.room.id, from_seq=r.seq_range()[0], to_seq=r.seq_range()[1])
            for r in rooms
        ]
        try:
            turn = await self._or_gone(
                self._upstream.register_turn(
                    agent.id,
                    turn_rooms,
                    turn_input,
                    self._engine.name,
                    agent.model,
                    plan.session_id,
                )
            )
        except UpstreamError as exc:
            self._unreachable("registering the turn", exc)
            return
        if turn is GONE:
            return
        self.trace.mark("registered")
        if self._turn_identity is not None:
            self._turn_identity.hand_out(turn.turn_secret)
        self.current_turn_id = turn.turn_id
        if self._stop_asked == turn.turn_id:
            # A person's Stop came before this answer named the turn here.
            stop.set()
        self.turn_started_at = datetime.now(UTC).isoformat(timespec="seconds")
        # The session this turn continues (None: a new one, known when it succeeds).
        self.session_id = plan.session_id
        self._changed()
        # The input the engine got last: the recorded one, unless it had to restart a
        # vanished session (a new session's input, recorded when the turn finishes).
        engine_input = turn_input

        def render_input(new_session: bool) -> str:
            nonlocal engine_input
            if new_session == plan.is_new:
                engine_input = turn_input
            else:
                engine_input = self._workspace.render_input(rooms, new_session)
            return engine_input

        request = TurnRequest(
            agent_id=agent.id,
            model=agent.model,
            plan=plan,
            render_input=render_input,
            wall_clock_limit_s=self.wall_clock_limit_s,
            egress=agent.egress,
            permission=agent.permission,
            approvals=TurnApprovals(self._upstream, turn.turn_id),
            capabilities=agent.capabilities,
            mark=self.trace.mark,
        )
        outcome = await self._run_engine(turn, request, stop, {r.room.id for r in rooms})
        if self._turn_identity is not None:
            self._turn_identity.take_back()
        if engine_input != turn_input:
            outcome.engine_input = engine_input
        if self._gone:
            # Another Computer owns the agent: any further write would be refused.
            return
        # Its MCP servers' state, when it changed (issue 27; rare, so off the usual path).
        await self._capabilities.after_turn(
            self._upstream, agent, self._engine.agent_status(agent.id)
        )
        next_step = NextStep(None)
        if outcome.status == "succeeded" or outcome.acked:
            self._retries.forget()
        elif outcome.status == "failed" and outcome.failure is not None:
            claimed = frozenset(m.id for r in rooms for m in r.messages)
            next_step = self._retries.failed(outcome.failure, claimed)
            if next_step.set_aside:
                await self._set_aside(turn, outcome.failure)
                if self._gone:
                    return
        await self._finish(turn, outcome, time.monotonic() - started)
        self._retry_later(next_step.retry_in_s, firm=next_step.firm)

    async def _run_engine(
        self, turn: RegisteredTurn, request: TurnRequest, stop: anyio.Event, rooms: set[str]
    ) -> Outcome:
        """Run the engine, then decide the outcome: ack only after a clean success, or
        when the turn failed after the agent's answer went out to every room it got."""

        async def send(first_index: int, events: list[dict[str, Any]]) -> None:
            await self._upstream.report_events(turn.turn_id, turn.fence, first_index, events)

        def on_stale() -> None:
            self._fence_out()
            stop.set()

        def on_superseded() -> None:
            self._supersede()
            stop.set()

        replies = ReplyAttempts()
        result: TurnResult | None = None
        broken: Exception | None = None
        reporter = RunReporter(
            send, self._metrics, on_stale, on_superseded, flush_window_s=self._retry_window_s
        )
        self._reporter = reporter
        try:
            async with reporter:

                async def on_event(event: EngineEvent) -> None:
                    self.trace.saw_event(event.type)
                    replies.see(event)
                    if event.type == "egress_denied":
                        self._metrics.egress_denied(
                            self.agent.id, self.agent.handle, event.data.get("count")
                        )
                    self._publish(
                        "engine",
                        {"agent_id": self.agent.id, "turn_id": turn.turn_id, **event.as_upstream()},
                    )
                    await reporter.report(event)

                try:
                    result = await self._engine.run_turn(request, on_event, stop)
                except Exception as exc:
                    # run_turn must never raise; one that does broke its contract.
                    broken = exc
        except Exception as exc:
            broken = broken or exc
        finally:
            self._reporter = None
        count = reporter.event_count
        if broken is not None or result is None:
            log.error("agent %s: the turn broke down", self.agent.handle, exc_info=broken)
            return Outcome("failed", _processing_failed(broken), Usage(), count)
        if self._gone:
            return Outcome("cancelled", None, result.usage, count)
        if stop.is_set() or result.status == "cancelled":
            # Stop and completion at the same moment count as stopped: no ack.
            return Outcome(
                "cancelled", Failure(FailureClass.STOPPED, "stopped"), result.usage, count
            )
        if result.status != "succeeded":
            failure = result.failure or Failure(FailureClass.ENGINE_ERROR, "the engine failed")
            # The answers may have gone out before it failed (a launcher killed after
            # `crew reply`): doing the turn again would answer the user twice. When the
            # events do not show it (the tool never finished), the server knows.
            if not replies.refusals and await self._ack_answered(
                turn, checked=not replies.answered_all(rooms)
            ):
                return Outcome("failed", failure, result.usage, count, acked=True)
            return Outcome("failed", failure, result.usage, count)
        refused = replies.failure()
        if refused is not None:
            # The agent tried to answer and could not: the user is still waiting. No ack.
            return Outcome("failed", refused, result.usage, count)
        # The engine kept the session for the next turn (None: it could not, one starts anew).
        self.session_id = result.session_id
        try:
            acked = await self._or_gone(
                self._retrying(
                    "the ack", lambda: self._upstream.ack(self.agent.id, turn.turn_id, turn.fence)
                )
            )
        except Exception as exc:
            # The messages come back at the next turn (an answer may be repeated then).
            log.exception("agent %s: the ack failed", self.agent.handle)
            failed = _processing_failed(exc)
            failure = Failure(failed.cls, failed.reason, environment=True)
            return Outcome("failed", failure, result.usage, count)
        if acked is GONE:
            return Outcome("cancelled", None, result.usage, count)
        self.trace.mark("acked")
        return Outcome("succeeded", None, result.usage, count)

    async def _ack_answered(self, turn: RegisteredTurn, *, checked: bool) -> bool:
        """Ack a failed turn whose answers went out; False when they did not (or the ack
        did not go through). `checked`: the server checks the agent replied in every room."""
        try:
            acked = await self._or_gone(
                self._retrying(
                    "the ack",
                    lambda: self._upstream.ack(
                        self.agent.id, turn.turn_id, turn.fence, only_if_answered=checked
                    ),
                )
            )
        except UpstreamRejected as exc:
            if exc.code != "not_answered":
                log.warning("agent %s: the ack failed: %s", self.agent.handle, exc)
            return False
        except UpstreamError as exc:
            log.warning("agent %s: the ack failed: %s", self.agent.handle, exc)
            return False
        if acked is GONE:
            return False
        log.info(
            "agent %s: the turn failed after its answers went out; its messages are read",
            self.agent.handle,
        )
        return True

    async def _set_aside(self, turn: RegisteredTurn, failure: Failure) -> None:
        """Mark the claim read unanswered; the server tells the room why."""
        reason = set_aside_reason(failure)
        log.warning(
            "agent %s: turns failed %d times on the same message; setting it aside (%s)",
            self.agent.handle,
            self._retries.set_aside_after,
            reason,
        )
        try:
            await self._or_gone(
                self._retrying(
                    "setting the message aside",
                    lambda: self._upstream.ack(
                        self.agent.id, turn.turn_id, turn.fence, set_aside={"reason": reason}
                    ),
                )
            )
        except UpstreamError as exc:
            # Not set aside: it comes back, fails again and is set aside then.
            log.warning("agent %s: setting the message aside failed: %s", self.agent.handle, exc)

    async def _finish(self, turn: RegisteredTurn, outcome: Outcome, duration_s: float) -> None:
        status, failure, usage = outcome.status, outcome.failure, outcome.usage
        failure_body = failure.as_upstream() if failure is not None else None
        # The last report of a stopped turn must still go out: shield it, but bound it.
        # (`_retrying` gives up at once when the Computer is stopping.)
        bound = FINISH_TIMEOUT_S + (0.0 if self._closing else self._retry_window_s)
        with anyio.CancelScope(shield=True), anyio.move_on_after(bound):
            try:
                await self._or_gone(
                    self._retrying(
                        "recording the turn",
                        lambda: self._upstream.finish_turn(
                            turn.turn_id,
                            turn.fence,
                            status,
                            failure_body,
                            usage.as_upstream(),
                            event_count=outcome.event_count,
                            engine_input=outcome.engine_input,
                            gateway_usage=usage.gateway,
                            trace=self.trace.as_upstream(),
                        ),
                    )
                )
            except UpstreamError as exc:
                # The server marks it `interrupted` when the next Computer connects.
                log.warning(
                    "agent %s: recording the turn as %s failed: %s", self.agent.handle, status, exc
                )
        self._metrics.turn_finished(status, duration_s)
        self._metrics.usage_reported(self.agent.id, self.agent.handle, usage)
        self.last_result = status
        self.last_reason = failure.reason if failure is not None and status == "failed" else None
        self.recent.appendleft(
            TurnRecord(
                id=turn.turn_id,
                status=status,
                duration_ms=int(duration_s * 1000),
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cost=usage.cost,
                failure_class=failure.cls.value if failure is not None else None,
                reason=failure.reason if failure is not None else None,
                trace=self.trace.as_upstream(),
            )
        )
        self._publish(
            "turn",
            {
                "agent_id": self.agent.id,
                "turn_id": turn.turn_id,
                "status": status,
                "failure": failure_body,
                "usage": usage.as_upstream(),
            },
        )

    async def _retrying(self, what: str, call: Callable[[], Awaitable[None]]) -> None:
        """Retry a call the server could not take (down, restarting) for a few seconds."""
        deadline = time.monotonic() + self._retry_window_s
        delay = 0.2
        while True:
            try:
                await call()
                return
            except UpstreamUnavailable as exc:
                if self._closing or time.monotonic() + delay > deadline:
                    raise
                log.info("agent %s: %s failed (%s); retrying", self.agent.handle, what, exc)
            await anyio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _or_gone(self, call: Awaitable[T]) -> T | Gone:
        """Await a call to the server; `GONE` when it says the agent is no longer ours.

        `StaleTurn` (another Computer owns the agent) fences this runner out,
        `Superseded` (another connection with this Computer's token) stops it:
        either way the caller writes nothing more. Other errors are the caller's.
        """
        try:
            return await call
        except StaleTurn:
            self._fence_out()
        except Superseded:
            self._supersede()
        return GONE

    # State.

    def _fence_out(self) -> None:
        if not self.fenced_out:
            log.warning(
                "agent %s: the server says another Computer owns it now; dropping its runner "
                "until the next agent sync",
                self.agent.handle,
            )
        self.fenced_out = True

    def _supersede(self) -> None:
        if self.superseded:
            return
        log.error(
            "agent %s: the server says another Computer connected with this Computer's token; "
            "stopping without marking messages read",
            self.agent.handle,
        )
        self.superseded = True
        if self._stop is not None:
            self._stop.set()
        self._on_superseded()

    def _set_state(self, state: RunnerState) -> None:
        if state is RunnerState.RUNNING and self._stop is not None and self._stop.is_set():
            state = RunnerState.STOPPING
        if self.state is not state:
            self.state = state
            self._changed()

    def _changed(self) -> None:
        self._publish("state", self.row())

    def row(self) -> dict[str, Any]:
        """This runner as one row of `GET /agents`."""
        return {
            "id": self.agent.id,
            "handle": self.agent.handle,
            "state": self.state.value,
            "turn_id": self.current_turn_id,
            "pending_wake": self.pending_wake,
            "last_result": self.last_result,
            "last_reason": self.last_reason,
            "session_id": self.session_id,
            "model": self.agent.model,
            "problem": None,
            "retry_at": self.retry_at,
            "turn_started_at": self.turn_started_at,
            "egress": self.agent.egress_summary(),
            "held": self.held,
        }

    def recent_turns(self) -> list[dict[str, Any]]:
        """The last turns, newest first."""
        return [asdict(record) for record in self.recent]


def _processing_failed(exc: BaseException | None) -> Failure:
    # A task group wraps one error in a group: name the error, not the group.
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    detail = (str(exc) or type(exc).__name__) if exc is not None else "no result"
    return Failure(FailureClass.ENGINE_ERROR, f"processing failed: {detail}"[:500])
