"""`OpenCodeEngine`: the one turn pipeline, whichever way its attempts run.

computer.md §3, docs/warm-engine.md. A turn goes through the same steps
whether it runs cold or warm:

1. prepare (`preparation.Preparation`): the paths, the whole environment,
   the config, the forwarded ports; or the result that ends the turn early
   (stopped, a bad model id, not logged in);
2. attempt, through the engine's `Way`: `cold_run.ColdRun` (one `opencode
   run` through the launcher's NDJSON run stream) or `warm_run.WarmRun` (the
   agent's `opencode serve` over HTTP + SSE, which runs a turn that gets no
   server the cold way);
3. classify (`attempt.attempt_result`), the same for both ways;
4. a saved session that vanished: once more, in a new session (the usage of
   both attempts is counted);
5. the session (`session.Sessions`): a turn that succeeded keeps its
   session for the next one, unless a `crew reply` of it ended refused (the
   runner fails such a turn).

Around steps 2 to 4 the model gateway's counters for the agent are read
(`Gateway.snapshot`): their difference is the turn's `usage.gateway`, and a
turn that failed after the gateway saw a 429 is a rate limit with the
provider's own `Retry-After`. The gateway lives as long as `maintain` runs
(the Computer's main loop).

`run_turn` never raises (except cancellation): a bug becomes `process_crashed`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import anyio

from computer_service.engine.attempt import Attempt, add_usage, attempt_result, crashed_result
from computer_service.engine.base import (
    EngineEvent,
    EventSink,
    Failure,
    FailureClass,
    SessionPlan,
    StopSignal,
    TurnRequest,
    TurnResult,
    WarmUp,
)
from computer_service.engine.failures import ReplyAttempts
from computer_service.engine.permission_events import denial_of
from computer_service.engine.preparation import Preparation, PreparedTurn
from computer_service.engine.session import ENGINE_NAME, Sessions
from computer_service.gateway.gateway import Gateway
from crew_common.layout import AgentPaths

log = logging.getLogger(__name__)


class Attempts(Protocol):
    """The attempts of one turn, run one way (`Way.attempts` opens them)."""

    async def attempt_in(self, session_id: str | None) -> Attempt:
        """One attempt in session `session_id` (None: a new session). What went wrong
        with the engine is in the attempt; a bug raises (the turn is `process_crashed`)."""
        ...

    async def settle(self, last: Attempt) -> bool:
        """After the turn's last attempt: amend it with what only the way knows (a warm
        server's resource limit); True when it changed and must be classified again."""
        ...


class Way(Protocol):
    """A way to run a turn's attempts: the launcher's run stream, or a warm server."""

    def attempts(
        self, turn: PreparedTurn, on_event: EventSink, stop: StopSignal
    ) -> AbstractAsyncContextManager[Attempts]:
        """The turn's attempts; leaving the context frees what they held (a server)."""
        ...

    # What the service shows of the way (the `Engine` protocol's part, handed on). The
    # defaults are a way that keeps nothing between turns (cold); a way that subclasses
    # `Way` inherits them.

    async def maintain(self) -> None:
        """For the Computer's life: the way's upkeep (a warm way stops idle servers)."""
        return None

    async def prewarm(self, turn: PreparedTurn) -> str:
        """Get ready for a turn like `turn` before it comes (a warm way starts the agent's
        server) → what happened, for the log; a way that keeps nothing: `cold`."""
        return "cold"

    def health(self) -> dict[str, object] | None:
        """The way's section of `/health`; None when it has nothing to show."""
        return None

    def agent_status(self, agent_id: str) -> dict[str, object]:
        """How this agent's turns run this way, for `/agents`."""
        return {"engine_mode": "cold"}

    def metric_lines(self) -> list[str]:
        """The way's counters for `/metrics`."""
        return []


class OpenCodeEngine:
    """The OpenCode engine (module doc): one pipeline; `way` runs its attempts."""

    name = ENGINE_NAME

    def __init__(
        self,
        preparation: Preparation,
        way: Way,
        *,
        sessions: Sessions | None = None,
        gateway: Gateway | None = None,
    ) -> None:
        self.preparation = preparation
        self.way = way
        self.sessions = sessions or Sessions(self.name)
        # The preparation's gateway (the Computer's one), counted and closed here; None in
        # tests whose preparation is a stand-in.
        self.gateway = gateway

    def plan_session(self, agent_id: str, model: str, agents_md: str) -> SessionPlan:
        """Continue the saved session when engine, model and AGENTS.md are unchanged."""
        return self.sessions.plan(self.preparation.paths(agent_id), model, agents_md)

    async def run_turn(
        self, request: TurnRequest, on_event: EventSink, stop: StopSignal
    ) -> TurnResult:
        """Run one turn (module doc). Never raises, except cancellation."""
        paths = self.preparation.paths(request.agent_id)
        secrets = self.preparation.secrets(paths)
        try:
            turn = await self.preparation.prepare(request, stop, paths, secrets)
            if isinstance(turn, TurnResult):
                return turn
            replies = ReplyAttempts()

            async def seen(event: EngineEvent) -> None:
                replies.see(event)
                await on_event(event)
                # A call the agent's policy refused: a turn event of its own (issue 24).
                if (denied := denial_of(event, request.permission)) is not None:
                    await on_event(denied)

            gateway = self.gateway
            before = gateway.snapshot(request.agent_id) if gateway is not None else None
            result = await run_attempts(self.way, turn, seen, stop)
            if gateway is not None and before is not None:
                result.usage.gateway = gateway.snapshot(request.agent_id).since(before)
                result = gateway_rate_limit(result, result.usage.gateway)
            # A refused `crew reply` fails the turn (the runner's rule): its session is not kept.
            if result.status == "succeeded" and replies.failure() is None:
                self._keep_session(paths, request, result)
            return result
        except Exception as exc:
            log.exception("agent %s: the engine broke during a turn", request.agent_id)
            return crashed_result(exc, secrets)

    def _keep_session(self, paths: AgentPaths, request: TurnRequest, result: TurnResult) -> None:
        """Step 5: keep a succeeded turn's session; one that is lost leaves the result none."""
        if result.session_id and not self.sessions.keep(
            paths, request.plan, request.model, result.session_id
        ):
            result.session_id = None  # the next turn starts a new session

    async def maintain(self) -> None:
        """The way's upkeep; the gateway's listeners stay open until this is cancelled."""
        if self.gateway is None:
            await self.way.maintain()
            return
        try:
            await self.way.maintain()
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await self.gateway.aclose()

    async def prewarm(self, agents: Sequence[WarmUp], *, most_recent: int | None = None) -> None:
        """Warm the agents' servers ahead of their turns (`base.Prewarming`): each agent's
        turn prepared as a real one would be (same environment, so the turn can use the
        server), then handed to the way. One after the other: starts compete for the CPU."""
        chosen = list(agents)
        if most_recent is not None:
            chosen = await anyio.to_thread.run_sync(self._most_recent, chosen, most_recent)
        for agent in chosen:
            outcome = await self._prewarm_one(agent)
            log.info("agent %s: prewarm: %s", agent.agent_id, outcome)
            if outcome == "budget":
                break  # the rest would not fit either

    def _most_recent(self, agents: list[WarmUp], count: int) -> list[WarmUp]:
        """The `count` agents whose session was kept last (`session.json`'s time), newest
        first; an agent that never kept one is left out."""
        dated = []
        for agent in agents:
            try:
                st = self.preparation.paths(agent.agent_id).session_file.lstat()
            except OSError:
                continue
            dated.append((st.st_mtime, agent))
        dated.sort(key=lambda pair: pair[0], reverse=True)
        return [agent for _, agent in dated[:count]]

    async def _prewarm_one(self, agent: WarmUp) -> str:
        request = TurnRequest(
            agent_id=agent.agent_id,
            model=agent.model,
            plan=SessionPlan(None),
            render_input=lambda new_session: "",
            egress=agent.egress,
            permission=agent.permission,
            capabilities=agent.capabilities,
        )
        paths = self.preparation.paths(agent.agent_id)
        try:
            turn = await self.preparation.prepare(
                request, anyio.Event(), paths, self.preparation.secrets(paths)
            )
            if isinstance(turn, TurnResult):
                # Its turn would end before the engine (not logged in, a bad model): nothing to warm.
                reason = turn.failure.reason if turn.failure is not None else turn.status
                return f"not warmed ({reason})"
            return await self.way.prewarm(turn)
        except Exception:
            log.exception("agent %s: the prewarm broke", agent.agent_id)
            return "failed"

    def health(self) -> dict[str, object] | None:
        return self.way.health()

    def agent_status(self, agent_id: str) -> dict[str, object]:
        return self.way.agent_status(agent_id)

    def metric_lines(self) -> list[str]:
        gateway = self.gateway.metric_lines() if self.gateway is not None else []
        return self.way.metric_lines() + gateway


async def run_attempts(
    way: Way, turn: PreparedTurn, on_event: EventSink, stop: StopSignal
) -> TurnResult:
    """Steps 2 to 4 of a turn (module doc): attempt, classify, once more if the session vanished."""
    request, secrets = turn.request, turn.secrets
    async with way.attempts(turn, on_event, stop) as attempts:
        a = await attempts.attempt_in(request.plan.session_id)
        result = attempt_result(a, stop, secrets)
        if _vanished(request, result):
            log.info(
                "agent %s: session %s vanished; starting a new one",
                request.agent_id,
                request.plan.session_id,
            )
            first, a = a, await attempts.attempt_in(None)
            add_usage(a.usage, first.usage)
            result = attempt_result(a, stop, secrets)
        if await attempts.settle(a):
            result = attempt_result(a, stop, secrets)
    return result


def gateway_rate_limit(result: TurnResult, traffic: dict[str, Any]) -> TurnResult:
    """A failed turn in which the gateway saw a 429: a rate limit, at the provider's time.

    OpenCode's own report of a rate limit may come late, without the
    provider's wait (a cold run's log does not say it) or not at all (it
    retries, then fails with whatever came last); the gateway saw the answer.
    A failure already classed `rate_limited` keeps its reason, with the
    provider's wait added when it had none or another.
    """
    if result.status != "failed" or result.failure is None or not traffic.get("rate_limited"):
        return result
    failure = result.failure
    if failure.cls is FailureClass.STOPPED:
        return result
    wait = traffic.get("retry_after_s")
    if failure.cls is FailureClass.RATE_LIMITED:
        if wait is None or failure.retry_after_s == wait:
            return result
        reason = (
            f"{failure.reason} The provider's answer (seen by the model gateway) asked to "
            f"wait {round(wait)} s: the agent tries again then."
        )
    else:
        said = f" and asked to wait {round(wait)} s before the next one" if wait is not None else ""
        reason = (
            f"the model provider is rate limiting requests (it answered 429){said}; the turn "
            "was ended and the agent tries again then. The messages are kept."
        )
    limited = Failure(
        FailureClass.RATE_LIMITED,
        reason,
        retry_after_s=wait if wait is not None else failure.retry_after_s,
    )
    return dataclasses.replace(result, failure=limited)


def _vanished(request: TurnRequest, result: TurnResult) -> bool:
    """The saved session this turn continued is gone (`session_invalid`)."""
    return (
        request.plan.session_id is not None
        and result.failure is not None
        and result.failure.cls is FailureClass.SESSION_INVALID
    )
