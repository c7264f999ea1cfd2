"""A real crew-server for runner tests, and a rig of runners against it (no processes of ours)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from computer_service.gate import TurnGate
from computer_service.home import AgentHome
from computer_service.metrics import Metrics
from computer_service.runner import Runner
from computer_service.upstream import Upstream
from crew_common.layout import AgentPaths
from crew_harness.waiting import wait_until_async
from crew_testkit.crew_server_proc import CrewServer
from crew_testkit.scripted import ScriptedEngine

MODEL = "local/scripted"


class UserApi:
    """The reference server's user API, as the user (every call sends the user token)."""

    def __init__(self, url: str, user_token: str) -> None:
        self.http = httpx.AsyncClient(
            base_url=url, timeout=10, headers={"Authorization": f"Bearer {user_token}"}
        )

    async def _ok(self, response: httpx.Response) -> Any:
        assert response.status_code < 300, (
            f"{response.request.url}: {response.status_code} {response.text}"
        )
        return response.json() if response.content else None

    async def computer(self) -> tuple[str, str]:
        body = await self._ok(await self.http.post("/api/computers", json={"name": "runner-test"}))
        return body["computer_id"], body["token"]

    async def agent(self, computer_id: str, handle: str) -> dict[str, Any]:
        body = {
            "handle": handle,
            "name": handle.title(),
            "persona": "Tests things.",
            "model": MODEL,
            "computer_id": computer_id,
        }
        agent: dict[str, Any] = await self._ok(await self.http.post("/api/agents", json=body))
        return agent

    async def dm(self, agent_id: str) -> dict[str, Any]:
        room: dict[str, Any] = await self._ok(
            await self.http.post("/api/rooms", json={"kind": "dm", "agent_ids": [agent_id]})
        )
        return room

    async def post(self, room_id: str, body: str) -> dict[str, Any]:
        message: dict[str, Any] = await self._ok(
            await self.http.post(f"/api/rooms/{room_id}/messages", json={"body": body})
        )
        return message

    async def turns(self, agent_id: str) -> list[dict[str, Any]]:
        """Oldest first."""
        rows = await self._ok(await self.http.get("/api/turns", params={"agent_id": agent_id}))
        return list(reversed(rows))

    async def turn(self, turn_id: str) -> dict[str, Any]:
        row: dict[str, Any] = await self._ok(await self.http.get(f"/api/turns/{turn_id}"))
        return row

    async def finished(
        self, agent_id: str, count: int, timeout: float = 15.0
    ) -> list[dict[str, Any]]:
        async def probe() -> list[dict[str, Any]] | None:
            done = [t for t in await self.turns(agent_id) if t["status"] != "running"]
            return done if len(done) >= count else None

        done = await wait_until_async(f"{count} finished turns", probe, timeout)
        return [await self.turn(t["id"]) for t in done]


@dataclass
class Rig:
    user: UserApi
    upstream: Upstream
    engine: ScriptedEngine
    gate: TurnGate
    metrics: Metrics
    runners: list[Runner] = field(default_factory=list)
    rooms: list[dict[str, Any]] = field(default_factory=list)

    @property
    def runner(self) -> Runner:
        return self.runners[0]

    @property
    def room(self) -> dict[str, Any]:
        return self.rooms[0]


@asynccontextmanager
async def rig(
    server: CrewServer,
    crew_home: Path,
    engine: ScriptedEngine,
    *,
    agents: int = 1,
    capacity: int = 2,
    upstream_class: type[Upstream] = Upstream,
) -> AsyncIterator[Rig]:
    """Create a Computer with `agents` agents (one DM each), run their runners, stop at exit."""
    if not isinstance(server, CrewServer):
        raise TypeError("rig() wants the CrewServer (for its user token), not its url")
    server_url = server.url
    user = UserApi(server_url, server.user_token)
    computer_id, token = await user.computer()
    upstream = upstream_class(server_url, token)
    await upstream.connect("test", "linux", "0", capacity)
    gate = TurnGate(capacity)
    metrics = Metrics()
    setup = Rig(user, upstream, engine, gate, metrics)
    suffix = uuid.uuid4().hex[:6]
    for n in range(agents):
        created = await user.agent(computer_id, f"a{n}-{suffix}")
        setup.rooms.append(await user.dm(created["id"]))
    run_id = uuid.uuid4().hex
    for record in await upstream.agents():
        home = AgentHome(AgentPaths(crew_home, run_id, record.id), record)
        home.prepare(await upstream.issue_token(record.id))
        setup.runners.append(
            Runner(
                record, upstream=upstream, engine=engine, workspace=home, gate=gate, metrics=metrics
            )
        )
    by_id = {r.agent.id: r for r in setup.runners}
    setup.runners = [by_id[_agent_of(room)] for room in setup.rooms]
    try:
        async with anyio.create_task_group() as tg:
            for runner in setup.runners:
                tg.start_soon(runner.run)
            yield setup
            for runner in setup.runners:
                runner.close()
    finally:
        await upstream.aclose()
        await user.http.aclose()


def _agent_of(room: dict[str, Any]) -> str:
    agents = [m["id"] for m in room["members"] if m["kind"] == "agent"]
    return agents[0]
