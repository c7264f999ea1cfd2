"""The introspection API on `<crew home>/sockets/computer.sock` (computer.md §5).

A small Starlette app over a narrow `ComputerView` of the service, the
`EventBus` (event_bus.py) for `GET /events`, and `IntrospectionServer`, which
serves the app with uvicorn on a 0600 Unix socket in a 0700 directory, refuses
peers of another uid, and keeps idle clients from exhausting it. `openapi/computer.yaml` documents the routes (a test checks).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal, Protocol

import orjson
import uvicorn
from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from computer_service.event_bus import BadEventId, BusEvent, EventBus, sse_frame
from computer_service.metrics import Metrics
from crew_common.connection_limits import (
    ConnectionLimits,
    SheddingListener,
    close_idlest,
    limited_h11,
)
from crew_common.unix_socket import bind_private_socket, peer_checked_h11

log = logging.getLogger(__name__)

# A person's `status`/`follow` and a desktop app need a handful; idle ones go after 10 s.
INTROSPECTION_LIMITS = ConnectionLimits(max_connections=64, header_timeout_s=10.0)

# --- the view of the service -------------------------------------------------


class SandboxHealth(BaseModel):
    """`ok` is None while the launcher is still starting (its self-test not in yet)."""

    ok: bool | None
    backend: str | None
    reason: str | None
    # PATH entries, toolchain roots and read_only_roots agents may not read, with why.
    not_granted: list[str] = Field(default_factory=list)
    # "namespace": each sandbox has its own network (Linux); "shared": the host's (macOS).
    network: str | None = None


class EngineHealth(BaseModel):
    """Whether the launcher found `opencode`, its version, and why it cannot run agents."""

    found: bool
    version: str | None
    # E.g. an OpenCode 2.x (another server API): no agent runs, each has this problem.
    reason: str | None = None


class WarmHealth(BaseModel):
    """The warm servers of this Computer (docs/warm-engine.md); absent when the engine is cold."""

    servers: int
    rss_bytes: int
    memory_budget_bytes: int
    server_ceiling_bytes: int
    idle_timeout_s: float


class McpServerState(BaseModel):
    """One MCP server of the agent (`engine.capabilities.mcp_states`)."""

    name: str
    state: Literal["starting", "connected", "failed", "disabled"]
    reason: str | None = None


class AgentEngine(BaseModel):
    """How the agent's turns run: on a warm server, or one `opencode run` each (cold)."""

    engine_mode: Literal["warm", "cold"]
    warm: bool = False
    warm_rss_bytes: int | None = None
    warm_idle_s: float | None = None
    cold_reason: str | None = None
    # The agent's MCP servers as its warm server last said (issue 27); null: not known
    # (no MCP servers, or no warm turn yet: a cold run has no server to ask).
    mcp_servers: list[McpServerState] | None = None


class Health(BaseModel):
    """`GET /health`."""

    version: str
    server_url: str
    ready: bool
    connected: bool
    connected_since: str | None = Field(
        description="when the event stream to the crew server opened (RFC 3339); "
        "null while it is not open",
    )
    sandbox: SandboxHealth
    engine: EngineHealth
    agents: int
    running_turns: int
    queued: int
    warm: WarmHealth | None = None


class DayUsage(BaseModel):
    """An agent's finished turns since midnight on this machine, as the engine reported them."""

    turns: int
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cache_read: int
    cache_write: int
    cost: float


NO_USAGE = DayUsage(
    turns=0,
    input_tokens=0,
    output_tokens=0,
    reasoning_tokens=0,
    cache_read=0,
    cache_write=0,
    cost=0.0,
)


class AgentRow(BaseModel):
    """One row of `GET /agents`: a runner, or an agent that cannot run (`problem`)."""

    id: str
    handle: str
    state: Literal["idle", "queued", "running", "stopping", "problem"]
    turn_id: str | None
    pending_wake: bool
    last_result: str | None
    last_reason: str | None
    session_id: str | None
    model: str
    problem: str | None
    retry_at: str | None = Field(
        description="when the runner tries its kept messages again by itself (RFC 3339), "
        "after a failure; `last_reason` says why",
    )
    turn_started_at: str | None = Field(
        default=None, description="when the running turn started (RFC 3339)"
    )
    today: DayUsage = NO_USAGE
    engine: AgentEngine | None = None
    egress: str = Field(
        description="its egress policy in one line: `public`, `open`, `none` or "
        "`allow github.com:443, …` (`crew_common.egress`)",
    )
    held: str | None = Field(
        default=None,
        description="why the server hands out no turn (`budget until <RFC 3339>: …`, issue "
        "24); it wakes the agent when that ends",
    )


class TurnSummary(BaseModel):
    """One recent turn of an agent."""

    id: str
    status: str
    duration_ms: int
    input_tokens: int
    output_tokens: int
    cost: float
    failure_class: str | None
    reason: str | None
    # Where its time went (turn_trace.py): step → epoch ms, the steps it reached.
    trace: dict[str, int] = {}


class AgentDetail(AgentRow):
    """`GET /agents/{id}`: the row plus its recent turns."""

    recent_turns: list[TurnSummary]


class ControlAnswer(BaseModel):
    """The answer to wake and stop: whether it did something."""

    id: str
    accepted: bool


class ComputerView(Protocol):
    """What the introspection API reads from and asks of the running service."""

    metrics: Metrics

    def health(self) -> Health: ...

    def agent_rows(self) -> list[AgentRow]: ...

    def agent_detail(self, agent_id: str) -> AgentDetail | None: ...

    async def wake_agent(self, agent_id: str) -> bool | None:
        """None: no such agent; False: it cannot run now (a problem); True: woken.

        A problem agent is prepared again first (its problem clears on success).
        """
        ...

    def stop_agent(self, agent_id: str) -> bool | None:
        """None: no such agent; False: no turn running; True: the turn is stopping."""
        ...


# --- the app -----------------------------------------------------------------


def create_app(view: ComputerView, bus: EventBus) -> Starlette:
    """The introspection Starlette app over `view`."""

    async def health(request: Request) -> Response:
        _no_query(request)
        return _json(view.health())

    async def agents(request: Request) -> Response:
        _no_query(request)
        return _json([row.model_dump() for row in view.agent_rows()])

    async def agent(request: Request) -> Response:
        detail = view.agent_detail(request.path_params["agent_id"])
        if detail is None:
            raise _no_agent(request.path_params["agent_id"])
        return _json(detail)

    async def wake(request: Request) -> Response:
        agent_id = request.path_params["agent_id"]
        woken = await view.wake_agent(agent_id)
        if woken is None:
            raise _no_agent(agent_id)
        if not woken:
            raise HTTPException(
                409, "this agent cannot run now (see its problem in GET /agents/{id})"
            )
        return _json(ControlAnswer(id=agent_id, accepted=True), status=202)

    async def stop(request: Request) -> Response:
        agent_id = request.path_params["agent_id"]
        stopping = view.stop_agent(agent_id)
        if stopping is None:
            raise _no_agent(agent_id)
        return _json(ControlAnswer(id=agent_id, accepted=stopping), status=202 if stopping else 200)

    async def events(request: Request) -> Response:
        _no_query(request)
        try:
            cursor, notice = bus.cursor_for(request.headers.get("last-event-id"))
        except BadEventId as exc:
            raise HTTPException(400, str(exc)) from exc
        return StreamingResponse(
            _sse(bus, cursor, notice),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def metrics(request: Request) -> Response:
        _no_query(request)
        return Response(
            view.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/agents", agents, methods=["GET"]),
        Route("/agents/{agent_id}", agent, methods=["GET"]),
        Route("/agents/{agent_id}/wake", wake, methods=["POST"]),
        Route("/agents/{agent_id}/stop", stop, methods=["POST"]),
        Route("/events", events, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )


async def _sse(bus: EventBus, cursor: int, notice: dict[str, Any] | None) -> AsyncIterator[bytes]:
    if bus.closed:
        return
    # A comment first, so a client sees the stream is open before any event.
    yield b": crew computer events\n\n"
    if notice is not None:
        yield sse_frame("missed", notice)
    # Closed with the response (a client that goes away), not whenever it is collected.
    async with contextlib.aclosing(bus.follow(cursor)) as items:
        async for item in items:
            if item is None:
                yield b": ping\n\n"
            elif isinstance(item, BusEvent):
                yield sse_frame(item.kind, item.data, bus.sse_id(item))
            else:
                # No `id:`: the reader's Last-Event-ID stays the last event it really got.
                yield sse_frame("missed", item)


def _json(model: BaseModel | list[Any], status: int = 200) -> Response:
    body = model.model_dump() if isinstance(model, BaseModel) else model
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _no_query(request: Request) -> None:
    if request.query_params:
        name = next(iter(request.query_params))[:60]
        raise HTTPException(400, f"unknown query parameter {name!r}; this endpoint takes none")


def _no_agent(agent_id: str) -> HTTPException:
    return HTTPException(404, f"no agent {agent_id[:100]!r} on this Computer (see GET /agents)")


_CODES = {404: "not_found", 405: "method_not_allowed", 409: "conflict", 400: "bad_request"}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _CODES.get(exc.status_code, "error")
    message = exc.detail
    where = f"{request.method} {request.url.path[:200]}"
    # Starlette's own routing answers carry only the bare status phrase.
    if exc.detail == "Not Found":
        message = f"no route {where} (see openapi/computer.yaml)"
    elif exc.detail == "Method Not Allowed":
        message = f"{where} is not allowed (see openapi/computer.yaml)"
    body = {"error": {"code": code, "message": message}}
    return Response(
        orjson.dumps(body),
        status_code=exc.status_code,
        media_type="application/json",
        headers=exc.headers,
    )


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("introspection %s %s failed", request.method, request.url.path)
    body = {"error": {"code": "internal", "message": f"the Computer failed to answer: {exc}"}}
    return Response(orjson.dumps(body), status_code=500, media_type="application/json")


# --- serving on the Unix socket ----------------------------------------------


class IntrospectionServer:
    """uvicorn serving the introspection app on the private socket; start, then stop.

    Idle connections cannot exhaust it: `limits` caps the open connections (a
    new one closes the idlest) and closes one that sends no request head in
    time, and the listening socket closes idle connections, then sheds waiting
    ones, instead of spinning when out of file descriptors
    (crew_common/connection_limits.py).
    """

    def __init__(
        self,
        app: Starlette,
        path: Path,
        allowed_uid: int | None = None,
        limits: ConnectionLimits = INTROSPECTION_LIMITS,
    ) -> None:
        self.path = path
        self._app = app
        self._allowed_uid = os.getuid() if allowed_uid is None else allowed_uid
        self._limits = limits
        self._sock: SheddingListener | None = None
        self._server: uvicorn.Server | None = None
        self._serving: uvicorn.Server | None = None

    async def start(self) -> None:
        """Bind the socket and start serving (raises `OSError`/`SocketInUse`)."""
        self._sock = SheddingListener.take(bind_private_socket(self.path), self._make_room)
        config = uvicorn.Config(
            self._app,
            http=limited_h11(peer_checked_h11(self._allowed_uid), self._limits),
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_keep_alive=int(self._limits.header_timeout_s),
            timeout_graceful_shutdown=2,
        )
        config.load()
        server = uvicorn.Server(config)
        # We drive startup/shutdown ourselves: uvicorn's serve() would take over the signals.
        # Not public API: tests/common/test_uvicorn_pin.py checks it for the pinned uvicorn.
        server.lifespan = config.lifespan_class(config)
        self._serving = server  # accepting may start before startup returns
        await server.startup(sockets=[self._sock])
        self._server = server

    def _make_room(self) -> bool:
        # Out of descriptors: an idle connection goes before a waiting one is shed.
        return self._serving is not None and close_idlest(self._serving.server_state.connections)

    @property
    def open_connections(self) -> int:
        """How many connections are being served now."""
        return len(self._server.server_state.connections) if self._server is not None else 0

    async def stop(self) -> None:
        """Stop accepting, end open connections (bounded), and remove the socket file."""
        try:
            if self._server is not None:
                self._server.should_exit = True
                await self._server.shutdown(sockets=[self._sock] if self._sock else None)
        finally:
            self._server = None
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
