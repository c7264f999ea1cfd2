"""`StaticView`: a fixed `ComputerView` for the introspection API's tests (no service behind it)."""

from __future__ import annotations

from computer_service.introspection import (
    AgentDetail,
    AgentRow,
    EngineHealth,
    Health,
    SandboxHealth,
    TurnSummary,
)
from computer_service.metrics import Metrics


class StaticView:
    """A ComputerView with two agents: one that can run, one with a problem."""

    def __init__(self) -> None:
        self.metrics = Metrics()
        self.woken: list[str] = []
        self.stopped: list[str] = []
        self.running = {"a1": True}

    def health(self) -> Health:
        return Health(
            version="0.1.0",
            server_url="http://127.0.0.1:8765",
            ready=True,
            connected=True,
            connected_since="2026-01-02T03:04:05+00:00",
            sandbox=SandboxHealth(ok=True, backend="bwrap", reason=None, network="namespace"),
            engine=EngineHealth(found=True, version="1.18.33"),
            agents=2,
            running_turns=1,
            queued=0,
        )

    def _row(self, agent_id: str) -> AgentRow:
        problem = agent_id == "a2"
        return AgentRow(
            id=agent_id,
            handle="alice" if agent_id == "a1" else "bob",
            state="problem" if problem else "running",
            turn_id=None if problem else "t1",
            pending_wake=False,
            last_result=None,
            last_reason=None,
            session_id=None,
            model="p/m",
            problem="cannot prepare" if problem else None,
            retry_at=None,
            turn_started_at=None if problem else "2026-01-02T03:04:05+00:00",
            egress="public",
        )

    def agent_rows(self) -> list[AgentRow]:
        return [self._row("a1"), self._row("a2")]

    def agent_detail(self, agent_id: str) -> AgentDetail | None:
        if agent_id not in ("a1", "a2"):
            return None
        turns = [
            TurnSummary(
                id="t0",
                status="failed",
                duration_ms=5,
                input_tokens=1,
                output_tokens=2,
                cost=0.5,
                failure_class="engine_error",
                reason="x",
            )
        ]
        return AgentDetail(**self._row(agent_id).model_dump(), recent_turns=turns)

    async def wake_agent(self, agent_id: str) -> bool | None:
        if agent_id == "a2":
            return False
        if agent_id != "a1":
            return None
        self.woken.append(agent_id)
        return True

    def stop_agent(self, agent_id: str) -> bool | None:
        if agent_id not in ("a1", "a2"):
            return None
        stopping = self.running.pop(agent_id, False)
        if stopping:
            self.stopped.append(agent_id)
        return stopping
