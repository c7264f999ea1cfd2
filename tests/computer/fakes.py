"""Swapped-in parts for service tests: `FakeParts` (no launcher) and `FakeCrewServer` (no server).

`FakeParts` uses real directories and agent homes with a scripted engine.
`FakeCrewServer` answers the Computer's upstream calls in-process through an
`httpx.MockTransport`: it records every call and plays scripted answers for
successive `GET /computer/events` (a status, or a stream of chunks and waits),
so reconnects, `retry:` and `Last-Event-ID` can be checked exactly. It keeps
messages, claims, turns and read positions as the contract of issue 10 says
(docs/contracts.md "Delivery at the edges"): the `Crew-Epoch` check, narrow
claims, set-aside notices and the gap an `event_count` reveals; `faults`
scripts failing answers per operation.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson

from computer_service.engine.base import Engine
from computer_service.event_stream import Backoff
from computer_service.home import AgentHome, AgentHomeError
from computer_service.parts_protocol import (
    AgentPreparationFailed,
    LauncherStatus,
    StartupFailed,
)
from computer_service.run_dir import RunDirectory, RunDirectoryError
from computer_service.upstream import AgentRecord
from crew_common.layout import AgentPaths

USABLE = LauncherStatus(True, "bwrap", None, True, "test", network="namespace")
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
        self.launcher_starts = 0
        self._launcher_died = anyio.Event()

    async def start_launcher(self) -> LauncherStatus:
        self.launcher_starting.set()
        if self.launcher_release is not None:
            await self.launcher_release.wait()
        self.launcher_starts += 1
        self._launcher_died = anyio.Event()
        return self.status

    async def stop_launcher(self) -> None:
        self.launcher_stopped = True

    def kill_launcher(self) -> None:
        """The launcher dies on its own (what `kill -9` of the real one does)."""
        self._launcher_died.set()

    async def launcher_exited(self) -> int:
        await self._launcher_died.wait()
        return -9

    async def models(self) -> list[str]:
        self.models_calls += 1
        if self.models_errors:
            raise self.models_errors.pop(0)
        # As the fake opencode lists them, and the model of `FakeCrewServer.agent`.
        return ["local/scripted", "local/other", "local/fake"]

    def prepare_run_dir(self) -> None:
        try:
            self.run.prepare()
        except RunDirectoryError as exc:
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

_AGENT_CALL = re.compile(r"/computer/agents/([^/]+)/(token|problem|unread|turns|ack)")
_TURN_CALL = re.compile(r"/computer/turns/([^/]+)/(events|finish)")
# A scripted answer for one operation: an error status, or an exception to raise
# (an `httpx.ConnectError` is an unreachable server).
Fault = int | Exception


@dataclass
class FakeMessage:
    """One message in a room of the fake server."""

    id: str
    agent_id: str  # the agent the room's messages are for
    room_id: str
    seq: int
    body: str
    order: int  # across rooms: oldest first

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "seq": self.seq, "body": self.body}


@dataclass
class FakeTurn:
    """A registered turn as the fake server keeps it."""

    id: str
    agent_id: str
    fence: int
    rooms: list[dict[str, Any]]
    input: str
    session_id: str | None
    events: dict[int, dict[str, Any]] = field(default_factory=dict)
    status: str = "running"
    failure: dict[str, Any] | None = None
    event_count: int | None = None
    gaps: list[tuple[int, int]] = field(default_factory=list)


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
        # Delivery (issue 10).
        self.epoch = 0
        self.faults: dict[str, list[Fault]] = {}
        self.messages: list[FakeMessage] = []
        self.read: dict[tuple[str, str], int] = {}  # (agent, room) → last read seq
        self.turns: dict[str, FakeTurn] = {}
        self.claims: list[tuple[str, int | None, list[str]]] = []  # agent, max_messages, ids
        self.acks: list[dict[str, Any]] = []
        self.notices: list[tuple[str, str]] = []  # room, text
        self.refused_epochs: list[str | None] = []
        self._order = itertools.count()

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

    def supersede(self) -> None:
        """Another Computer connected with the same token: the current epoch is old now."""
        self.epoch += 1

    def post(self, agent_id: str, body: str, room_id: str | None = None) -> FakeMessage:
        """A user message for `agent_id` in its DM (or `room_id`)."""
        room = room_id or f"dm-{agent_id}"
        seq = 1 + max((m.seq for m in self.messages if m.room_id == room), default=0)
        message = FakeMessage(f"msg-{room}-{seq}", agent_id, room, seq, body, next(self._order))
        self.messages.append(message)
        return message

    def unread(self, agent_id: str) -> list[FakeMessage]:
        """The agent's messages after its read positions, oldest first."""
        return sorted(
            (
                m
                for m in self.messages
                if m.agent_id == agent_id and m.seq > self.read.get((agent_id, m.room_id), 0)
            ),
            key=lambda m: m.order,
        )

    def finished_turns(self, agent_id: str) -> list[FakeTurn]:
        """The agent's recorded turns, oldest first."""
        return [t for t in self.turns.values() if t.agent_id == agent_id and t.status != "running"]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        method, path = request.method, request.url.path
        self.calls.append((method, path))
        if (method, path) == ("POST", "/computer/connect"):
            self.epoch += 1
            return _json(
                {"computer_id": "c1", "epoch": self.epoch, "server_time": "2026-01-01T00:00:00Z"}
            )
        refused = self._check_epoch(request)
        if refused is not None:
            return refused
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
        if (match := _TURN_CALL.fullmatch(path)) is not None:
            turn_id, what = match.groups()
            if (fault := self._fault(what)) is not None:
                return fault
            return self._turn_call(self.turns[turn_id], what, orjson.loads(request.content))
        if (match := _AGENT_CALL.fullmatch(path)) is not None:
            agent_id, what = match.groups()
            if (fault := self._fault(what)) is not None:
                return fault
            if what == "token":
                return _json({"token": f"tok-{agent_id}"})
            if what == "unread":
                body = orjson.loads(request.content) if request.content else {}
                return self._claim(agent_id, body.get("max_messages"))
            if what == "turns":
                return self._register(agent_id, orjson.loads(request.content))
            if what == "ack":
                return self._ack(agent_id, orjson.loads(request.content))
            if method == "PUT":
                self.problems[agent_id] = orjson.loads(request.content)["reason"]
            else:
                self.problems.pop(agent_id, None)
            return httpx.Response(204)
        return _error(404)

    def _check_epoch(self, request: httpx.Request) -> httpx.Response | None:
        header = request.headers.get("crew-epoch")
        if header is None or not header.isdigit():
            self.refused_epochs.append(header)
            return _json({"error": {"code": "bad_request", "message": "Crew-Epoch missing"}}, 400)
        if int(header) < self.epoch:
            self.refused_epochs.append(header)
            message = "another Computer connected with this token"
            return _json({"error": {"code": "superseded", "message": message}}, 409)
        return None

    def _fault(self, operation: str) -> httpx.Response | None:
        scripted = self.faults.get(operation)
        if not scripted:
            return None
        fault = scripted.pop(0)
        if isinstance(fault, Exception):
            raise fault
        return _error(fault)

    def _claim(self, agent_id: str, max_messages: int | None) -> httpx.Response:
        claimed = self.unread(agent_id)[: max_messages or None]
        self.claims.append((agent_id, max_messages, [m.id for m in claimed]))
        rooms: dict[str, list[FakeMessage]] = {}
        for message in claimed:
            rooms.setdefault(message.room_id, []).append(message)
        answer = [
            {"room": {"id": room_id, "kind": "dm"}, "messages": [m.as_json() for m in found]}
            for room_id, found in rooms.items()
        ]
        return _json({"rooms": answer})

    def _register(self, agent_id: str, body: dict[str, Any]) -> httpx.Response:
        turn_id = f"turn-{len(self.turns) + 1}"
        self.turns[turn_id] = FakeTurn(
            turn_id, agent_id, self.epoch, body["rooms"], body["input"], body["session_id"]
        )
        return _json({"turn_id": turn_id, "fence": self.epoch})

    def _ack(self, agent_id: str, body: dict[str, Any]) -> httpx.Response:
        if body.get("only_if_answered"):
            # The fake stores no agent replies: no turn was ever answered.
            answer = {"error": {"code": "not_answered", "message": "no reply in every room"}}
            return _json(answer, 409)
        self.acks.append(body)
        turn = self.turns[body["turn_id"]]
        for room in turn.rooms:
            self.read[(agent_id, room["room_id"])] = room["to_seq"]
        if (aside := body.get("set_aside")) is not None:
            for room in turn.rooms:
                count = sum(
                    1
                    for m in self.messages
                    if m.room_id == room["room_id"] and room["from_seq"] <= m.seq <= room["to_seq"]
                )
                handle = agent_id.removeprefix("agent-")
                self.notices.append(
                    (
                        room["room_id"],
                        f"@{handle} could not handle {count} message(s), and set them aside: "
                        f"{aside['reason']}",
                    )
                )
        return httpx.Response(204)

    def _turn_call(self, turn: FakeTurn, what: str, body: dict[str, Any]) -> httpx.Response:
        if what == "events":
            for n, event in enumerate(body["events"]):
                turn.events[body["first_index"] + n] = event
            return httpx.Response(204)
        turn.status, turn.failure = body["status"], body.get("failure")
        turn.event_count = body.get("event_count")
        # The input the engine got, when not the registered one (as the server records it).
        turn.input = body.get("input", turn.input)
        # The missing stretches of [0, event_count), as the server records gaps.
        start: int | None = None
        for index in range(turn.event_count or 0):
            if index not in turn.events and start is None:
                start = index
            elif index in turn.events and start is not None:
                turn.gaps.append((start, index))
                start = None
        if start is not None:
            turn.gaps.append((start, turn.event_count or 0))
        return httpx.Response(204)

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
