"""The warm way (`WarmRun`) against a hostile or broken server (an in-process stand-in, no OpenCode).

The stand-in listens on 127.0.0.1 in this very process, so the owner check
passes; what it answers is scripted per test. A server that breaks before the
prompt was accepted means a cold turn; after it, `process_crashed` and the
server dropped; oversized events count as broken, never as memory.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from computer_service.engine.attempt import Attempt
from computer_service.engine.base import (
    EngineEvent,
    FailureClass,
    SessionPlan,
    TurnRequest,
    TurnResult,
)
from computer_service.engine.pipeline import OpenCodeEngine, Way
from computer_service.engine.preparation import PreparedTurn
from computer_service.engine.warm_pool import WarmPool
from computer_service.engine.warm_run import WarmRun
from crew_common.egress import EgressPolicy
from crew_common.launcher_wire import DeniedFrame, ExitFrame, ServerInfo, ServerRequest
from crew_common.layout import AgentPaths
from crew_common.procfs import process_start_time

pytestmark = pytest.mark.anyio

S = "ses_standin"


class StandIn:
    """A fake `opencode serve`: `events(message_id)` scripts what `/event` sends after the prompt."""

    def __init__(self) -> None:
        self.silent = False
        self.script: list[bytes] = []
        self.prompted = threading.Event()
        self.message_id = ""
        self.aborted = False
        self.permission_status = 200
        self.beat = b""
        self._loop: asyncio.AbstractEventLoop | None = None

    def app(self) -> Starlette:
        async def event(request: Request) -> Response:
            async def body() -> AsyncIterator[bytes]:
                if self.silent:
                    await asyncio.sleep(3600)
                yield b'data: {"type":"server.connected","properties":{}}\n\n'
                while not self.prompted.is_set():
                    await asyncio.sleep(0.01)
                for chunk in self.script:
                    yield chunk.replace(b"MSG", self.message_id.encode())
                while self.beat:  # heartbeats (none unless set): the server is alive
                    await asyncio.sleep(0.3)
                    yield self.beat
                await asyncio.sleep(3600)

            return StreamingResponse(body(), media_type="text/event-stream")

        async def session(request: Request) -> Response:
            return JSONResponse({"id": S})

        async def prompt(request: Request) -> Response:
            self.message_id = orjson.loads(await request.body())["messageID"]
            self.prompted.set()
            return Response(status_code=204)

        async def abort(request: Request) -> Response:
            self.aborted = True
            return JSONResponse(True)

        async def permission(request: Request) -> Response:
            return Response(status_code=self.permission_status)

        return Starlette(
            routes=[
                Route("/event", event),
                Route("/session", session, methods=["POST"]),
                Route("/session/{id}/prompt_async", prompt, methods=["POST"]),
                Route("/session/{id}/abort", abort, methods=["POST"]),
                Route("/permission/{id}/reply", permission, methods=["POST"]),
            ]
        )


@pytest.fixture
def standin() -> Iterator[tuple[StandIn, int]]:
    server = StandIn()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(server.app(), log_config=None, lifespan="off")
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not running.started:
        threading.Event().wait(0.01)
    try:
        yield server, port
    finally:
        running.should_exit = True
        thread.join(10)
        sock.close()


class Launcher:
    """The launcher's server endpoints: every server is the stand-in (in this process)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.never_ready = False  # a server that never starts
        self.stopped: list[str] = []
        self.limit_hit: str | None = None  # what `GET /servers/{id}/limit` answers
        self.denials: list[DeniedFrame] = []  # what `POST /servers/{id}/denials` drains

    def generation(self) -> object:
        return self

    async def start_server(self, request: ServerRequest) -> ServerInfo:
        if self.never_ready:
            await anyio.sleep_forever()
        started = process_start_time(os.getpid())
        assert started is not None
        return ServerInfo(
            agent_id=request.agent_id,
            pid=os.getpid(),
            start_time=started,
            port=self.port,
            started_at="2026-01-01T00:00:00.000+00:00",
            listener_pid=os.getpid(),
            listener_start_time=started,
        )

    async def sweep_server(self, agent_id: str) -> tuple[int, int | None]:
        return 0, None

    async def server_denials(self, agent_id: str) -> list[DeniedFrame]:
        drained, self.denials = self.denials, []
        return drained

    async def server_limit_hit(self, agent_id: str) -> str | None:
        return self.limit_hit

    async def stop_server(self, agent_id: str) -> None:
        self.stopped.append(agent_id)

    async def servers(self) -> list[ServerInfo]:
        return []


class Cold(Way):
    """The cold way the warm way falls back to; a cold attempt just succeeds."""

    def __init__(self) -> None:
        self.cold_turns = 0

    @asynccontextmanager
    async def attempts(self, turn: PreparedTurn, on_event: Any, stop: Any) -> AsyncIterator[Cold]:
        self.cold_turns += 1
        yield self

    async def attempt_in(self, session_id: str | None) -> Attempt:
        return Attempt(
            session_id="ses_cold", lines=1, exit=ExitFrame(t="exit", code=0, stderr_tail="")
        )

    async def settle(self, last: Attempt) -> bool:
        return False


def engine(port: int) -> tuple[WarmRun, Cold, Launcher]:
    cold, launcher = Cold(), Launcher(port)
    pool = WarmPool(launcher, memory_budget=1 << 40)
    warm = WarmRun(
        cold,
        pool,
        end_grace_s=1.0,
        connected_timeout_s=1.0,
        heartbeat_timeout_s=1.0,
        progress_timeout_s=2.0,
    )
    return warm, cold, launcher


class Prepared:
    """The pipeline's preparation for agent `a`, without any file: a fixed environment."""

    def paths(self, agent_id: str) -> AgentPaths:
        return AgentPaths(Path("/crew"), "r", agent_id)

    def secrets(self, paths: AgentPaths) -> list[str]:
        return []

    async def prepare(
        self, request: TurnRequest, stop: Any, paths: AgentPaths, secrets: list[str]
    ) -> PreparedTurn:
        return PreparedTurn(
            request=request,
            paths=paths,
            env={"PWD": "/crew/agents/a/work"},
            ports=[],
            bin_dir=Path("/crew/runtime/r/bin"),
            interpreter_dirs=[],
            stdout_limit=8 * 1024 * 1024,
            secrets=secrets,
            egress=request.egress,
        )


async def turn(
    warm: WarmRun, limit_s: float = 30 * 60, egress: EgressPolicy | None = None
) -> tuple[TurnResult, list[EngineEvent]]:
    """One turn through the pipeline, the warm way (the session is not kept: a plan by hand)."""
    events: list[EngineEvent] = []

    async def on_event(event: EngineEvent) -> None:
        events.append(event)

    request = TurnRequest(
        "a",
        "local/scripted",
        SessionPlan(None),
        lambda new: "hi",
        wall_clock_limit_s=limit_s,
        egress=egress or EgressPolicy(),
    )
    engine = OpenCodeEngine(Prepared(), warm)  # type: ignore[arg-type]
    with anyio.fail_after(30):
        result = await engine.run_turn(request, on_event, anyio.Event())
    return result, events


def frame(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


def part(kind: str, **more: Any) -> bytes:
    body = {"type": kind, "sessionID": S, "messageID": "msg_x", **more}
    return frame({"type": "message.part.updated", "properties": {"part": body}})


FINAL = frame(
    {
        "type": "message.updated",
        "properties": {
            "info": {
                "sessionID": S,
                "role": "assistant",
                "parentID": "MSG",
                "time": {"completed": 1},
            }
        },
    }
)
IDLE = frame({"type": "session.status", "properties": {"sessionID": S, "status": {"type": "idle"}}})


async def test_a_scripted_turn_gives_runs_events(standin: tuple[StandIn, int]) -> None:
    server, port = standin
    server.script = [
        part("step-start"),
        part("text", text="ok", time={"start": 1, "end": 2}),
        part("step-finish", reason="stop", tokens={"input": 3, "output": 2}, cost=0.5),
        FINAL,
        IDLE,
    ]
    warm, cold, _ = engine(port)
    result, events = await turn(warm)
    assert result.status == "succeeded" and result.session_id == S
    assert [e.type for e in events] == ["step_start", "text", "step_finish"]
    assert result.usage.input_tokens == 3 and result.usage.cost == 0.5
    assert cold.cold_turns == 0 and warm.pool.counters.warm_turns == 1


async def test_the_servers_denials_are_events_at_the_end_of_the_turn(
    standin: tuple[StandIn, int],
) -> None:
    server, port = standin
    server.script = [part("text", text="ok", time={"start": 1, "end": 2}), FINAL, IDLE]
    warm, _, launcher = engine(port)
    launcher.denials = [
        DeniedFrame(
            t="denied", address="10.99.0.1", port=80, protocol="tcp", name="lan.test", count=3
        )
    ]
    result, events = await turn(warm)
    assert result.status == "succeeded"
    assert [e.type for e in events] == ["text", "egress_denied"]
    assert events[-1].data == {
        "address": "10.99.0.1",
        "port": 80,
        "protocol": "tcp",
        "name": "lan.test",
        "count": 3,
    }
    # Drained: the next turn has none of them again.
    server.script = [part("text", text="ok", time={"start": 1, "end": 2}), FINAL, IDLE]
    _, events = await turn(warm)
    assert [e.type for e in events] == ["text"]


async def test_a_new_egress_policy_restarts_the_server_with_it(
    standin: tuple[StandIn, int],
) -> None:
    server, port = standin
    warm, _, launcher = engine(port)
    sent: list[ServerRequest] = []
    start = launcher.start_server

    async def recording(request: ServerRequest) -> ServerInfo:
        sent.append(request)
        return await start(request)

    launcher.start_server = recording  # type: ignore[method-assign]
    server.script = [part("text", text="ok", time={"start": 1, "end": 2}), FINAL, IDLE]
    result, _ = await turn(warm)
    # A turn that ended well keeps its server: only the new policy stops it.
    assert result.status == "succeeded" and launcher.stopped == []
    server.script = [part("text", text="ok", time={"start": 1, "end": 2}), FINAL, IDLE]
    await turn(warm, egress=EgressPolicy(mode="none"))
    assert [r.egress.policy().mode for r in sent] == ["public", "none"]
    assert launcher.stopped[:1] == ["a"]


async def test_a_silent_server_is_dropped_and_the_turn_runs_cold(
    standin: tuple[StandIn, int],
) -> None:
    server, port = standin
    server.silent = True
    warm, cold, launcher = engine(port)
    result, _ = await turn(warm)
    assert result.status == "succeeded" and result.session_id == "ses_cold"
    assert cold.cold_turns == 1 and launcher.stopped == ["a"]


async def test_a_server_that_goes_quiet_mid_turn_crashes_the_turn(
    standin: tuple[StandIn, int],
) -> None:
    server, port = standin
    server.script = [part("step-start")]  # then nothing, not even a heartbeat
    warm, cold, launcher = engine(port)
    result, events = await turn(warm)
    assert result.failure is not None and result.failure.cls is FailureClass.PROCESS_CRASHED
    assert [e.type for e in events] == ["step_start"]
    assert cold.cold_turns == 0 and launcher.stopped == ["a"]


async def test_an_oversized_event_breaks_the_server_not_the_memory(
    standin: tuple[StandIn, int],
) -> None:
    server, port = standin
    server.script = [b"data: " + b"x" * (17 * 1024 * 1024) + b"\n\n"]
    warm, _, launcher = engine(port)
    result, events = await turn(warm)
    assert result.failure is not None and result.failure.cls is FailureClass.PROCESS_CRASHED
    assert "over" in result.failure.reason and events == []
    assert launcher.stopped == ["a"]


def retry(in_s: float) -> bytes:
    status = {"type": "retry", "attempt": 1, "message": "quota exceeded", "next": 0}
    status["next"] = int((time.time() + in_s) * 1000)
    return frame({"type": "session.status", "properties": {"sessionID": S, "status": status}})


async def test_a_retry_far_off_ends_the_turn_as_rate_limited_at_once(
    standin: tuple[StandIn, int],
) -> None:
    # Issue 20: OpenCode waits out a Retry-After: 600 by itself, silently; the turn must not.
    server, port = standin
    server.script = [part("step-start"), retry(600)]
    warm, cold, _ = engine(port)
    result, _ = await turn(warm)  # the turn's limit is 30 min; fail_after(30) in `turn`
    assert result.failure is not None and result.failure.cls is FailureClass.RATE_LIMITED
    assert result.failure.retry_after_s is not None
    assert 590 <= result.failure.retry_after_s <= 600
    assert "quota exceeded" in result.failure.reason and "10 min" in result.failure.reason
    assert server.aborted and cold.cold_turns == 0


async def test_a_retry_soon_is_waited_for_by_opencode_itself(
    standin: tuple[StandIn, int],
) -> None:
    server, port = standin
    server.script = [part("step-start"), retry(1), part("step-start"), FINAL, IDLE]
    warm, _, _ = engine(port)
    result, _ = await turn(warm)
    assert result.status == "succeeded" and not server.aborted


async def test_a_permission_answer_the_server_refuses_ends_the_turn_not_the_wall_clock(
    standin: tuple[StandIn, int],
) -> None:
    server, port = standin
    server.permission_status = 500
    asked = {"id": "per_1", "sessionID": S, "permission": "bash", "patterns": ["*"]}
    server.script = [part("step-start"), frame({"type": "permission.asked", "properties": asked})]
    warm, _, launcher = engine(port)
    result, _ = await turn(warm)  # limit 30 min; `turn` gives it 30 s
    assert result.failure is not None and result.failure.cls is FailureClass.PROCESS_CRASHED
    assert result.failure.environment  # the server's fault: retried, never set aside
    assert "permission" in result.failure.reason and "HTTP 500" in result.failure.reason
    assert launcher.stopped == ["a"]  # the server is replaced


async def test_a_server_that_never_starts_costs_the_turns_own_limit(
    standin: tuple[StandIn, int],
) -> None:
    # Issue 20: a turn limited to 20 s ran 80.7 s (the launcher's 60 s start, then cold).
    _, port = standin
    warm, cold, launcher = engine(port)
    launcher.never_ready = True
    with anyio.fail_after(10):  # far less than the launcher's 60 s start timeout
        result, _ = await turn(warm, limit_s=2)
    assert result.failure is not None and result.failure.cls is FailureClass.PROCESS_CRASHED
    assert result.failure.environment and "did not start" in result.failure.reason
    assert cold.cold_turns == 0  # nothing left of the limit for a cold run
    assert warm.pool.failed_starts == {"a": 1} and launcher.stopped == ["a"]


async def test_a_prompt_that_makes_no_progress_ends_the_turn_not_the_wall_clock(
    standin: tuple[StandIn, int],
) -> None:
    # The prompt is accepted, then only heartbeats: nothing of the session ever comes.
    server, port = standin
    heartbeat = frame({"type": "server.heartbeat", "properties": {}})
    server.script = [heartbeat]
    server.beat = heartbeat
    warm, _, launcher = engine(port)
    result, _ = await turn(warm)  # limit 30 min; `turn` gives it 30 s
    assert result.failure is not None and result.failure.cls is FailureClass.PROCESS_CRASHED
    assert result.failure.environment and "never started on it" in result.failure.reason
    assert launcher.stopped == ["a"]
