"""Both OpenCode engines of one Computer, on a real launcher, the real OpenCode and the scripted model.

`EngineRig` starts what `LocalParts` starts for a real Computer (the launcher
process, the run directory, agent homes) but no crew server: turns are driven
by hand, as the runner would (plan the session, run; the engine keeps the
session), so the same scripted turns can go through the cold and the warm way
and their events be compared. The user's OpenCode login (the scripted model's) is
written into `$HOME`, which the test suite points at a temporary directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from computer_service.bootstrap import Bootstrap, TurnLimits
from computer_service.engine.base import EngineEvent, StopSignal, TurnRequest, TurnResult
from computer_service.engine.pipeline import OpenCodeEngine
from computer_service.engine.warm_pool import WarmPool
from computer_service.engine.warm_run import WarmRun
from computer_service.home import AgentHome
from computer_service.parts import LocalParts
from computer_service.upstream import AgentRecord
from crew_common.permissions import PermissionPolicy
from crew_harness.demo import write_scripted_login
from crew_harness.scripted_model import ScriptedModel

MODEL = "local/scripted"


@dataclass
class TurnRecord:
    """What one turn gave: its result and its events in order."""

    result: TurnResult
    events: list[EngineEvent] = field(default_factory=list)


class EngineRig:
    """A launcher and both engines; `async with EngineRig(...) as rig`."""

    def __init__(
        self,
        model: ScriptedModel,
        opencode: Path,
        *,
        warm_memory_mb: int | None = None,
        turn_limits: TurnLimits | None = None,
    ) -> None:
        self.home = Path(os.environ["HOME"])
        self.model = model
        write_scripted_login(self.home, model.base_url)
        self.bootstrap = Bootstrap(
            server_url="http://127.0.0.1:9",
            token="rig-token-0123456789",
            crew_home=self.home / ".crew",
            opencode_path=opencode,
            engine_mode="warm",
            warm_memory_mb=warm_memory_mb,
            turn_limits=turn_limits or TurnLimits(),
        )
        self.parts = LocalParts(self.bootstrap)
        self.homes: dict[str, AgentHome] = {}
        self.warm: OpenCodeEngine
        self.cold: OpenCodeEngine
        self.pool: WarmPool  # the warm way's servers

    async def __aenter__(self) -> EngineRig:
        status = await self.parts.start_launcher()
        if status.unavailable_reason():
            await self.parts.stop_launcher()
            raise RuntimeError(f"the launcher is not usable: {status.unavailable_reason()}")
        self.parts.prepare_run_dir()
        engine = self.parts.engine()
        assert isinstance(engine, OpenCodeEngine) and isinstance(engine.way, WarmRun)
        # The same Computer's engine, every turn the cold way (sessions shared, as both
        # ways share them when a warm turn falls back to cold).
        cold = OpenCodeEngine(
            engine.preparation, engine.way.cold, sessions=engine.sessions, gateway=engine.gateway
        )
        self.warm, self.cold, self.pool = engine, cold, engine.way.pool
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.pool.close()
            if self.warm.gateway is not None:
                await self.warm.gateway.aclose()
            await self.parts.stop_launcher()
            self.parts.remove_run_dir()

    def agent(self, agent_id: str) -> AgentHome:
        """Prepare an agent's home (as the roster does)."""
        record = AgentRecord(id=agent_id, handle=agent_id, name=agent_id.title(), model=MODEL)
        home = self.parts.prepare_agent(record, f"token-of-{agent_id}")
        assert isinstance(home, AgentHome)
        self.homes[agent_id] = home
        return home

    def engine(self, kind: str) -> OpenCodeEngine:
        return self.warm if kind == "warm" else self.cold

    async def turn(
        self,
        kind: str,
        agent_id: str,
        text: str,
        *,
        stop: StopSignal | None = None,
        wall_clock_limit_s: float = 120.0,
        permission: PermissionPolicy | None = None,
        approvals: Any = None,
    ) -> TurnRecord:
        """One turn of `agent_id` with input `text`, as the runner runs it."""
        home = self.homes[agent_id]
        engine = self.engine(kind)
        plan = engine.plan_session(agent_id, MODEL, home.agents_md)
        request = TurnRequest(
            agent_id=agent_id,
            model=MODEL,
            plan=plan,
            render_input=lambda new: text,
            wall_clock_limit_s=wall_clock_limit_s,
            permission=permission or PermissionPolicy(),
            approvals=approvals,
        )
        record = TurnRecord(TurnResult("failed"))

        async def on_event(event: EngineEvent) -> None:
            record.events.append(event)

        record.result = await engine.run_turn(request, on_event, stop or anyio.Event())
        return record


def comparable(events: list[EngineEvent]) -> list[dict[str, Any]]:
    """The events without what differs between two runs of the same turn (times, durations,
    tool call ids) or between the engines (a warm turn's `tool_start`s, which cold lacks)."""
    out = []
    for event in events:
        if event.type == "tool_start":
            continue
        data = dict(event.data)
        data.pop("duration_ms", None)
        data.pop("call_id", None)
        out.append({"type": event.type, "data": data, "facts": event.facts})
    return out
