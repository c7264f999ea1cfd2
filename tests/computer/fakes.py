"""Swapped-in parts for service tests: `FakeParts` (no launcher) and `FakeCrewServer` (no server).

`FakeParts` uses real directories and agent homes with a scripted engine.
`FakeCrewServer` answers the Computer's upstream calls in-process through an
`httpx.MockTransport`: it records every call and plays scripted answers for
successive `GET /computer/events` (a status, or a stream of chunks and waits),
so reconnects, `retry:` and `Last-Event-ID` can be checked exactly.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson

from computer_service.engine.base import Engine
from computer_service.event_stream import Backoff
from computer_service.home import AgentHome, AgentHomeError, RunDirectory
from computer_service.parts_protocol import (
    AgentPreparationFailed,
    LauncherStatus,
    StartupFailed,
)
from computer_service.upstream import AgentRecord
from crew_common.layout import AgentPaths

USABLE = LauncherStatus(True, "bwrap", None, True, "test")
UNUSABLE = LauncherStatus(False, None, "bwrap not found (looked in /usr/bin)", True, "test")


class FakeParts:
    """Real directories and agent homes; a scripted engine instead of the launcher."""

    def __init__(self, crew_home: Path, engine: Engine, status: LauncherStatus = USABLE) -> None:
        self.crew_home = crew_home
        self.run = RunDirectory(crew_home, "testrun")
        self._engine = engine
        self.status = status
        self.launcher_stopped = False
        self.launcher_starting = anyio.Event()
        # Set to an unset event to hold start_launcher until the test sets it.
        self.launcher_release: anyio.Event | None = None
        # Raised by models(), one per call, before answering; then the list.
        self.models_errors: list[Exception] = []
        self.models_calls = 0

    async def start_launcher(self) -> LauncherStatus:
        self.launcher_starting.set()
        if self.launcher_release is not None:
            await self.launcher_release.wait()
        return self.status

    async def stop_launcher(self) -> None:
        self.launcher_stopped = True

    async def launcher_exited(self) -> int:
        await anyio.sleep_forever()
        return 0

    async def models(self) -> list[str]:
        self.models_calls += 1
        if self.models_errors:
            raise self.models_errors.pop(0)
        return ["local/fake"]

    def prepare_run_dir(self) -> None:
        try:
            self.run.prepare()
        except AgentHomeError as exc:
            raise StartupFailed(str(exc)) from exc

    def remove_run_dir(self) -> None:
        self.run.remove()

    def engine(self) -> Engine:
        return self._engine

    def prepare_agent(self, agent: AgentRecord, token: str) -> AgentHome:
        home = AgentHome(AgentPaths(self.crew_home, "testrun", agent.id), agent)
        try:
            home.prepare(token)
        except AgentHomeError as exc:
            raise AgentPreparationFailed(str(exc)) from exc
        return home


class RecordingBackoff(Backoff):
    """The service's backoff, remembering every delay it handed out."""

    def __init__(self, initial_s: float, cap_s: float) -> None:
        super().__init__(initial_s, cap_s)
        self.delays: list[float] = []
        self.bases: list[float] = []

    def next_delay(self) -> float:
        self.bases.append(self.base_s)
        delay = super().next_delay()
        self.delays.append(delay)
        return delay


# One scripted answer to `GET /computer/events`: an HTTP status (an error
# answer), or a 200 stream of byte chunks and waits (async callables).
StreamPart = bytes | Callable[[], Awaitable[None]]
EventsAnswer = int | list[StreamPart]

_AGENT_CALL = re.compile(r"/computer/agents/([^/]+)/(token|problem|unread)")


class FakeCrewServer:
    """The crew server's Computer API, in-process; every call recorded in order."""

    def __init__(self) -> None:
        self.agents: list[dict[str, Any]] = []
        self.calls: list[tuple[str, str]] = []
        self.last_event_ids: list[str | None] = []
        self.events_answers: list[EventsAnswer] = []
        self.models_statuses: list[int] = []
        self.models: list[str] | None = None
        self.problems: dict[str, str] = {}
        self.closed = anyio.Event()

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def agent(self, handle: str, **fields: Any) -> dict[str, Any]:
        """Assign a new agent to the Computer."""
        record = {
            "id": f"agent-{handle}",
            "handle": handle,
            "name": handle.title(),
            "persona": "Tests things.",
            "engine": "opencode",
            "model": "local/fake",
            **fields,
        }
        self.agents.append(record)
        return record

    def count(self, method: str, path: str) -> int:
        return sum(1 for call in self.calls if call == (method, path))

    def unread_claims(self, agent_id: str) -> int:
        return self.count("POST", f"/computer/agents/{agent_id}/unread")

    async def handle(self, request: httpx.Request) -> httpx.Response:
        method, path = request.method, request.url.path
        self.calls.append((method, path))
        if (method, path) == ("POST", "/computer/connect"):
            return _json({"computer_id": "c1", "epoch": 1, "server_time": "2026-01-01T00:00:00Z"})
        if (method, path) == ("GET", "/computer/agents"):
            return _json(list(self.agents))
        if (method, path) == ("PUT", "/computer/models"):
            status = self.models_statuses.pop(0) if self.models_statuses else 204
            if status != 204:
                return _error(status)
            self.models = orjson.loads(request.content)["models"]
            return httpx.Response(204)
        if (method, path) == ("GET", "/computer/events"):
            self.last_event_ids.append(request.headers.get("last-event-id"))
            answer = self.events_answers.pop(0) if self.events_answers else self.quiet()
            if isinstance(answer, int):
                return _error(answer)
            return httpx.Response(
                200, headers={"content-type": "text/event-stream"}, content=self._stream(answer)
            )
        if (match := _AGENT_CALL.fullmatch(path)) is not None:
            agent_id, what = match.groups()
            if what == "token":
                return _json({"token": f"tok-{agent_id}"})
            if what == "unread":
                return _json({"rooms": []})
            if method == "PUT":
                self.problems[agent_id] = orjson.loads(request.content)["reason"]
            else:
                self.problems.pop(agent_id, None)
            return httpx.Response(204)
        return _error(404)

    def quiet(self) -> list[StreamPart]:
        """An open stream that stays quiet until the test ends (the answer once scripts run out)."""
        return [b": connected\n\n", self.closed.wait]

    async def _stream(self, parts: list[StreamPart]) -> AsyncIterator[bytes]:
        for part in parts:
            if isinstance(part, bytes):
                yield part
            else:
                await part()


def _json(body: Any, status: int = 200) -> httpx.Response:
    return httpx.Response(
        status, content=orjson.dumps(body), headers={"content-type": "application/json"}
    )


def _error(status: int) -> httpx.Response:
    codes = {401: "unauthorized", 404: "not_found", 422: "invalid", 503: "unavailable"}
    code = codes.get(status, "error")
    return _json({"error": {"code": code, "message": f"scripted {status}"}}, status)
