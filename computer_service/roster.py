"""`Roster`: this Computer's agents — a runner each, or the problem that keeps it from running.

computer.md §1 step 6 and §2. `sync_agents` makes the runners match the
server's agent list: new agents get their directories, token and a runner;
changed ones are replaced; agents moved away are dropped. An agent that
cannot run (no sandbox, no engine, an egress policy that cannot be read, a
directory that cannot be prepared or repaired before a turn) is kept as a
problem, reported upstream once, and prepared again at the next sync and at
its next wake-up (from the server or the introspection socket); a success
clears the problem. A launcher replaced by an unusable one makes every agent
a problem until a later one is usable.
A runner fenced out by a newer connection stays dropped until the next sync.
An agent whose token the server could not issue (down, its disk full) is synced
again by the roster itself, with backoff: the stream may stay open and bring
no event that would do it, and the agent's messages would wait for good.

The roster owns its runners' task group (`running`); leaving it stops every
runner. It also answers the introspection API's agent questions.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from anyio.abc import TaskGroup

from computer_service.delivery import RETRY_BASE_S, RETRY_WINDOW_S, Retries
from computer_service.engine.base import Engine
from computer_service.gate import TurnGate
from computer_service.introspection import AgentDetail, AgentRow, DayUsage, TurnSummary
from computer_service.metrics import Metrics
from computer_service.parts_protocol import AgentPreparationFailed, Parts
from computer_service.runner import DEFAULT_TURN_TIME_LIMIT_S, Runner
from computer_service.turn_identity import turn_identity_of
from computer_service.upstream import AgentRecord, Superseded, Upstream, UpstreamError

log = logging.getLogger(__name__)

# Stopping a turn is SIGINT, then SIGKILL after 2 s, then a last report: give it room.
RUNNER_STOP_TIMEOUT_S = 10.0


class Roster:
    """The runners and the agents with a problem, kept in step with the server's list."""

    def __init__(
        self,
        upstream: Upstream,
        parts: Parts,
        *,
        gate: TurnGate,
        metrics: Metrics,
        publish: Callable[[str, dict[str, Any]], None],
        superseded: Callable[[], None] = lambda: None,
        retry_base_s: float = RETRY_BASE_S,
        retry_window_s: float = RETRY_WINDOW_S,
        turn_time_limit_s: float = DEFAULT_TURN_TIME_LIMIT_S,
    ) -> None:
        self.upstream = upstream
        # Called when the server says a newer connection replaced this Computer.
        self._superseded = superseded
        # The first wait of a runner's retries after a failed turn (bootstrap `retry_base_s`).
        self._retry_base_s = retry_base_s
        self._retry_window_s = retry_window_s
        self.parts = parts
        self.gate = gate
        self.metrics = metrics
        self._publish = publish
        self._turn_time_limit_s = turn_time_limit_s
        self.runners: dict[str, Runner] = {}
        self.problems: dict[str, tuple[AgentRecord, str]] = {}
        # Agents whose turn was fenced out: no runner until the next full sync.
        self.fenced: set[str] = set()
        # Why no agent can run here (set at start-up from the launcher's health).
        self.unavailable: str | None = "starting"
        # The engine runners use; only set when the launcher is usable.
        self.engine: Engine | None = None
        # Set after the first complete sync.
        self.synced = anyio.Event()
        self._group: TaskGroup | None = None
        # One preparation at a time: a sync and a wake-up must not both add a runner.
        self._preparing = anyio.Lock()
        # A token could not be issued since the last sync; the task syncing again for it.
        self._token_failed = False
        self._sync_again: anyio.CancelScope | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Own the runners' task group; on leaving, stop every runner (turns end as cancelled)."""
        async with anyio.create_task_group() as group:
            self._group = group
            yield
            if self._sync_again is not None:
                self._sync_again.cancel()
            runners = list(self.runners.values())
            for runner in runners:
                runner.close()
            with anyio.move_on_after(RUNNER_STOP_TIMEOUT_S) as waiting:
                for runner in runners:
                    await runner.finished.wait()
            if waiting.cancelled_caught:
                log.warning(
                    "runners did not stop within %.0f s; cancelling them", RUNNER_STOP_TIMEOUT_S
                )
                group.cancel_scope.cancel()

    # --- keeping in step with the server -------------------------------------

    async def sync_agents(self) -> list[Runner]:
        """Create, replace and drop runners to match the server's agent list; the new runners."""
        async with self._preparing:
            return await self._sync_agents()

    async def _sync_agents(self) -> list[Runner]:
        agents = {agent.id: agent for agent in await self.upstream.agents()}
        self.fenced.clear()
        for agent_id in [a for a in self.runners if a not in agents]:
            await self._drop_runner(agent_id)
        for agent_id in [a for a in self.problems if a not in agents]:
            del self.problems[agent_id]
        created: list[Runner] = []
        for agent in agents.values():
            current = self.runners.get(agent.id)
            if current is not None and current.agent.settings() == agent.settings():
                current.update_agent(agent)
                continue
            if current is not None:
                await self._drop_runner(agent.id)
            # Agents with a problem are tried again: a later success clears it.
            if (runner := await self._add_runner(agent)) is not None:
                created.append(runner)
        self.synced.set()
        return created

    async def wake_from_server(self, agent_id: str, *, now: bool = False) -> None:
        """A `wake` event: wake its runner; a problem agent is prepared again first.

        An agent not known yet (e.g. just assigned) is synced first. `now` (a person's
        Wake): the turn runs at once, even inside a retry's backoff.
        """
        if agent_id in self.fenced:
            return
        if agent_id in self.problems:
            await self._prepare_again(agent_id)
        elif agent_id not in self.runners:
            await self.sync_agents()
        if (runner := self.runners.get(agent_id)) is not None:
            runner.wake(now=now)

    def stop_from_server(self, agent_id: str, turn_id: str) -> None:
        """A `stop` event (a person's Stop): the agent's runner stops `turn_id` only if that
        is its turn now. A late one (replayed after a reconnect, the turn already over)
        stops nothing: the next turn is another's business."""
        runner = self.runners.get(agent_id)
        if runner is None or not runner.stop_turn_of(turn_id):
            log.info(
                "agent %s: a stop for turn %s, which is not running here; nothing stopped",
                runner.agent.handle if runner is not None else agent_id,
                turn_id,
            )

    async def _prepare_again(self, agent_id: str) -> None:
        """Try a problem agent again (its reason told the user to fix something, then wake it)."""
        async with self._preparing:
            # Another sync or wake-up may have got there first.
            if (problem := self.problems.get(agent_id)) is not None:
                await self._add_runner(problem[0])

    async def launcher_unusable(self, reason: str) -> None:
        """The launcher was replaced by an unusable one: every runner's agent gets the reason.

        The runners are dropped, so none claims messages only to fail them.
        """
        self.unavailable = reason
        async with self._preparing:
            for agent_id, runner in list(self.runners.items()):
                await self._drop_runner(agent_id)
                await self._report_problem(runner.agent, reason)

    async def launcher_usable(self) -> None:
        """A later launcher is usable: prepare every agent again (clearing problems), wake them."""
        self.unavailable = None
        await self.agents_changed()

    async def agents_changed(self) -> None:
        """An `agents` event: sync, and wake the new runners."""
        # New runners may have messages waiting from before they existed.
        for runner in await self.sync_agents():
            runner.wake()

    def wake_all(self) -> None:
        """Wake every runner (after a (re)connect: messages may have arrived meanwhile)."""
        for runner in self.runners.values():
            runner.wake()

    async def _drop_runner(self, agent_id: str) -> None:
        runner = self.runners.pop(agent_id, None)
        if runner is None:
            return
        runner.close()
        with anyio.move_on_after(RUNNER_STOP_TIMEOUT_S):
            await runner.finished.wait()

    async def _add_runner(self, agent: AgentRecord) -> Runner | None:
        if self.unavailable is not None or self.engine is None:
            await self._report_problem(agent, self.unavailable or "engine unavailable")
            return None
        if (problem := agent.problem()) is not None:
            # Never a turn under a policy (or without the capabilities) the user did not
            # set: fixed on the server, the next sync (its `agents` event) tries again.
            await self._report_problem(agent, problem)
            return None
        try:
            token = await self.upstream.issue_token(agent.id)
            workspace = self.parts.prepare_agent(agent, token)
        except Superseded:
            self._superseded()
            return None
        except UpstreamError as exc:
            log.warning("agent %s: issuing its token failed: %s", agent.handle, exc)
            self._token_failed = True
            if self._sync_again is None:
                assert self._group is not None, "runners are added only inside `running()`"
                self._sync_again = anyio.CancelScope()
                self._group.start_soon(self._sync_until_issued, self._sync_again)
            return None
        except AgentPreparationFailed as exc:
            await self._report_problem(agent, str(exc))
            return None
        runner = Runner(
            agent,
            upstream=self.upstream,
            engine=self.engine,
            workspace=workspace,
            gate=self.gate,
            metrics=self.metrics,
            publish=self._publish,
            wall_clock_limit_s=self._turn_time_limit_s,
            on_superseded=self._superseded,
            retry_base_s=self._retry_base_s,
            retry_window_s=self._retry_window_s,
            turn_identity=turn_identity_of(workspace),
        )
        self.runners[agent.id] = runner
        assert self._group is not None, "runners are added only inside `running()`"
        self._group.start_soon(self._run_runner, runner)
        try:
            # Cleared also when set by an earlier run: the server keeps problems.
            await self.upstream.clear_problem(agent.id)
        except UpstreamError as exc:
            log.warning("agent %s: clearing its problem failed: %s", agent.handle, exc)
        self.problems.pop(agent.id, None)
        return runner

    async def _sync_until_issued(self, scope: anyio.CancelScope) -> None:
        """Sync again, with backoff, until a sync issues every agent's token."""
        retries = Retries(base_s=self._retry_base_s)
        with scope:
            while self._token_failed:
                delay = retries.next_delay()
                log.info("syncing the agents again in %.1f s (a token was not issued)", delay)
                await anyio.sleep(delay)
                self._token_failed = False
                try:
                    await self.agents_changed()
                except UpstreamError as exc:
                    log.warning("syncing the agents failed: %s", exc)
                    self._token_failed = True
        self._sync_again = None

    async def _run_runner(self, runner: Runner) -> None:
        current = False
        try:
            await runner.run()
        finally:
            if self.runners.get(runner.agent.id) is runner:
                current = True
                # Fenced out: dropped until the next agent sync says otherwise.
                del self.runners[runner.agent.id]
                if runner.fenced_out and not runner.superseded:
                    self.fenced.add(runner.agent.id)
        if current and runner.problem is not None:
            # Its workspace could not be repaired: a problem until a wake-up prepares it again.
            await self._report_problem(runner.agent, runner.problem)

    async def _report_problem(self, agent: AgentRecord, reason: str) -> None:
        known = self.problems.get(agent.id)
        self.problems[agent.id] = (agent, reason)
        if known is not None and known[1] == reason:
            return
        log.warning("agent %s cannot run: %s", agent.handle, reason)
        try:
            await self.upstream.set_problem(agent.id, reason)
        except UpstreamError as exc:
            log.warning("agent %s: reporting its problem failed: %s", agent.handle, exc)

    # --- the introspection view ----------------------------------------------

    @property
    def agent_count(self) -> int:
        """How many agents this Computer has: running or with a problem."""
        return len(self.runners) + len(self.problems)

    def agent_rows(self) -> list[AgentRow]:
        """`GET /agents`: runners and agents with a problem, by handle."""
        rows = [
            AgentRow.model_validate({**runner.row(), "engine": self._engine_row(runner_id)})
            for runner_id, runner in self.runners.items()
        ]
        rows += [_problem_row(agent, reason) for agent, reason in self.problems.values()]
        return sorted((self._with_usage(row) for row in rows), key=lambda row: row.handle)

    def _engine_row(self, agent_id: str) -> dict[str, object] | None:
        """How this agent's turns run (warm server or cold), for `/agents`."""
        return self.engine.agent_status(agent_id) if self.engine is not None else None

    def agent_detail(self, agent_id: str) -> AgentDetail | None:
        """`GET /agents/{id}`; None for an unknown agent."""
        if (runner := self.runners.get(agent_id)) is not None:
            turns = [TurnSummary.model_validate(t) for t in runner.recent_turns()]
            engine = self._engine_row(agent_id)
            row = self._with_usage(AgentRow.model_validate({**runner.row(), "engine": engine}))
            return AgentDetail.model_validate({**row.model_dump(), "recent_turns": turns})
        if (problem := self.problems.get(agent_id)) is not None:
            row = self._with_usage(_problem_row(*problem))
            return AgentDetail.model_validate({**row.model_dump(), "recent_turns": []})
        return None

    def _with_usage(self, row: AgentRow) -> AgentRow:
        """The row with its agent's tokens and cost today (kept by `Metrics`)."""
        today = self.metrics.today(row.id)
        return row.model_copy(
            update={"today": DayUsage.model_validate(today, from_attributes=True)}
        )

    async def wake_agent(self, agent_id: str) -> bool | None:
        """`POST /agents/{id}/wake`: None unknown, False cannot run, True woken.

        A problem agent is prepared again first: woken when that succeeds.
        """
        if agent_id in self.problems:
            await self._prepare_again(agent_id)
        if (runner := self.runners.get(agent_id)) is not None:
            runner.wake()
            return True
        return False if agent_id in self.problems else None

    def stop_agent(self, agent_id: str) -> bool | None:
        """`POST /agents/{id}/stop`: None unknown, False nothing running, True stopping."""
        if (runner := self.runners.get(agent_id)) is not None:
            return runner.stop_turn()
        return False if agent_id in self.problems else None


def _problem_row(agent: AgentRecord, reason: str) -> AgentRow:
    return AgentRow(
        id=agent.id,
        handle=agent.handle,
        state="problem",
        turn_id=None,
        pending_wake=False,
        last_result=None,
        last_reason=None,
        session_id=None,
        model=agent.model,
        problem=reason,
        retry_at=None,
        egress=agent.egress_summary(),
    )
