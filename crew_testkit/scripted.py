"""A scripted in-process engine for runner tests (implements `Engine`; swapped in, never patched)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from computer_service.engine.base import (
    EngineEvent,
    EventSink,
    Failure,
    FailureClass,
    SessionPlan,
    StopSignal,
    TurnRequest,
    TurnResult,
    Usage,
)

AT = "2026-01-01T00:00:00+00:00"
Behaviour = Callable[["ScriptedEngine", TurnRequest, EventSink, StopSignal], Awaitable[TurnResult]]


async def succeed(
    engine: ScriptedEngine, request: TurnRequest, on_event: EventSink, stop: StopSignal
) -> TurnResult:
    """Three events, then success with a session id."""
    for event in (
        EngineEvent("step_start", AT, {}),
        EngineEvent("text", AT, {"text": f"turn {len(engine.inputs)}"}),
        EngineEvent(
            "step_finish",
            AT,
            {"reason": "stop", "tokens": {"input": 10, "output": 5}, "cost": 0.01},
        ),
    ):
        await on_event(event)
    return TurnResult(
        "succeeded", session_id=f"ses-{request.agent_id[:8]}", usage=Usage(10, 5, cost=0.01)
    )


async def fail(
    engine: ScriptedEngine, request: TurnRequest, on_event: EventSink, stop: StopSignal
) -> TurnResult:
    await on_event(EngineEvent("error", AT, {"name": "APIError", "message": "boom"}))
    return TurnResult("failed", Failure(FailureClass.ENGINE_ERROR, "the model said boom"))


async def wait_for_stop(
    engine: ScriptedEngine, request: TurnRequest, on_event: EventSink, stop: StopSignal
) -> TurnResult:
    await on_event(EngineEvent("step_start", AT, {}))
    engine.started.set()
    await stop.wait()
    return TurnResult("cancelled", Failure(FailureClass.STOPPED, "stopped"))


def blocking(release: anyio.Event, then: Behaviour = succeed) -> Behaviour:
    """Signal `started`, wait for `release`, then behave as `then`."""

    async def behaviour(
        engine: ScriptedEngine, request: TurnRequest, on_event: EventSink, stop: StopSignal
    ) -> TurnResult:
        engine.started.set()
        await release.wait()
        return await then(engine, request, on_event, stop)

    return behaviour


def sleeping(seconds: float) -> Behaviour:
    async def behaviour(
        engine: ScriptedEngine, request: TurnRequest, on_event: EventSink, stop: StopSignal
    ) -> TurnResult:
        await anyio.sleep(seconds)
        return await succeed(engine, request, on_event, stop)

    return behaviour


@dataclass
class ScriptedEngine:
    """Runs each turn by the next behaviour in `script` (then `default`); records everything."""

    script: list[Behaviour] = field(default_factory=list)
    default: Behaviour = succeed
    name: str = "opencode"
    inputs: list[str] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)
    # The wall-clock limit each turn was given.
    limits: list[float] = field(default_factory=list)
    running: int = 0
    peak: int = 0
    started: anyio.Event = field(default_factory=anyio.Event)

    def plan_session(self, agent_id: str, model: str, agents_md: str) -> SessionPlan:
        return SessionPlan(None)

    async def maintain(self) -> None:
        return None

    def health(self) -> dict[str, object] | None:
        return None

    def agent_status(self, agent_id: str) -> dict[str, object]:
        return {"engine_mode": "cold"}

    def metric_lines(self) -> list[str]:
        return []

    async def run_turn(
        self, request: TurnRequest, on_event: EventSink, stop: StopSignal
    ) -> TurnResult:
        self.inputs.append(request.render_input(request.plan.is_new))
        self.agents.append(request.agent_id)
        self.limits.append(request.wall_clock_limit_s)
        behaviour = self.script.pop(0) if self.script else self.default
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            return await behaviour(self, request, on_event, stop)
        finally:
            self.running -= 1
