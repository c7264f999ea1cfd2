"""The cold way: each attempt is one `opencode run`, in the sandbox, through the launcher.

computer.md §3. The launcher gets a typed request (the prepared environment,
the session, the input on stdin) and builds the argv and the sandbox; it
streams the run back as NDJSON frames. Each stdout line becomes an event; the
exit frame, the last `error` event and the stderr tail later decide the
failure class (`attempt.attempt_result`). Stop, the wall-clock limit, the
step guard and a provider's long Retry-After end the run: asked to stop, and
dropped if it does not exit in time (the launcher kills it then).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import anyio
from pydantic import ValidationError

from computer_service.engine.attempt import (
    COLD_RATE_LIMIT_RETRY_S,
    RETRY_PATIENCE_S,
    TURN_TITLE,
    Attempt,
)
from computer_service.engine.base import EventSink, Failure, FailureClass, StopSignal, TurnRequest
from computer_service.engine.egress_events import denied_event
from computer_service.engine.events import OutputCheck, engine_event_of
from computer_service.engine.pipeline import Way
from computer_service.engine.preparation import PreparedTurn
from computer_service.launcher_client import LauncherError, LauncherRefused, LauncherUnavailable
from crew_common.launcher_wire import (
    DeniedFrame,
    EgressWire,
    EngineArgs,
    ExitFrame,
    Frame,
    LineFrame,
    LogFrame,
    RunRequest,
    StartedFrame,
)

log = logging.getLogger(__name__)

# After asking the launcher to stop a run, how long to wait for its exit frame
# before dropping the connection (which makes the launcher kill the run).
END_GRACE_S = 10.0


class Launcher(Protocol):
    """What the cold way needs of the launcher (`LauncherClient` satisfies it)."""

    def run(self, request: RunRequest) -> AsyncGenerator[Frame, None]: ...

    async def stop(self, run_id: str) -> None: ...


class ColdRun(Way):
    """The cold way (module doc): nothing kept between turns, so `Way`'s defaults for
    what the service shows. Replace `launcher` when the launcher restarts."""

    def __init__(
        self,
        launcher: Launcher,
        *,
        end_grace_s: float = END_GRACE_S,
        retry_patience_s: float = RETRY_PATIENCE_S,
    ) -> None:
        self.launcher = launcher
        self.end_grace_s = end_grace_s
        self.retry_patience_s = retry_patience_s

    @asynccontextmanager
    async def attempts(
        self, turn: PreparedTurn, on_event: EventSink, stop: StopSignal
    ) -> AsyncIterator[ColdAttempts]:
        """The turn's runs; nothing outlives one (the launcher ends it with its stream)."""
        yield ColdAttempts(self, turn, on_event, stop)


class ColdAttempts:
    """The runs of one cold turn."""

    def __init__(
        self, way: ColdRun, turn: PreparedTurn, on_event: EventSink, stop: StopSignal
    ) -> None:
        self.way = way
        self.turn = turn
        self.on_event = on_event
        self.stop = stop

    async def attempt_in(self, session_id: str | None) -> Attempt:
        """One `opencode run` through the launcher (module doc)."""
        request = self.turn.request
        on_event, stop = self.on_event, self.stop
        run_id = str(uuid.uuid4())
        try:
            run = self._run_request(run_id, session_id)
        except ValidationError as exc:
            # What the launcher would refuse, refused before it is sent (one wire schema).
            a = Attempt()
            a.launcher_failure = Failure(
                FailureClass.SANDBOX, f"the sandbox refused the run: {_first_error(exc)}"
            )
            return a
        a = Attempt()
        started = anyio.Event()
        read_scope = anyio.CancelScope()

        async def end_run(why: str) -> None:
            if a.ending is None:
                a.ending = why
            # The launcher only knows the run once it started it.
            with anyio.move_on_after(self.way.end_grace_s):
                await started.wait()
            try:
                await self.way.launcher.stop(run_id)
            except LauncherError as exc:
                log.warning("agent %s: stopping run %s failed: %s", request.agent_id, run_id, exc)
            await anyio.sleep(self.way.end_grace_s)
            read_scope.cancel()  # no exit frame in time: drop the stream, the launcher kills it

        async def watch_stop() -> None:
            await stop.wait()
            await end_run("stopped")

        async def watch_clock() -> None:
            await anyio.sleep(request.wall_clock_limit_s)
            a.time_limit_s = request.wall_clock_limit_s
            await end_run("timeout")

        async def watch_retry() -> None:
            # OpenCode waiting longer than its own retries: a provider's Retry-After.
            while a.requests.waiting_for(anyio.current_time()) <= self.way.retry_patience_s:
                await anyio.sleep(1.0)
            a.retry_after_s = COLD_RATE_LIMIT_RETRY_S
            a.guard_reason = a.requests.error
            await end_run("rate_limited")

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_stop)
            tg.start_soon(watch_clock)
            tg.start_soon(watch_retry)
            with read_scope:
                try:
                    # aclosing: leaving early (stop, guard, cancellation) closes the
                    # stream at once, which makes the launcher end the run.
                    async with contextlib.aclosing(self.way.launcher.run(run)) as frames:
                        async for frame in frames:
                            if isinstance(frame, LogFrame):
                                a.requests.see_log(frame.line, anyio.current_time())
                            elif isinstance(frame, LineFrame):
                                a.lines += 1
                                a.requests.progressed()
                                event = engine_event_of(frame.data)
                                finding = a.check.see(event)
                                guard = None
                                if finding is None:
                                    guard = a.track(event, request.max_steps)
                                await on_event(event)
                                if finding is not None:
                                    await self._unverified(a.check, finding, request, on_event)
                                if guard and a.ending is None:
                                    a.guard_reason = guard
                                    tg.start_soon(end_run, "guard")
                            elif isinstance(frame, DeniedFrame):
                                await on_event(denied_event(frame))
                            elif isinstance(frame, StartedFrame):
                                started.set()
                                request.mark("engine_accepted")
                            elif isinstance(frame, ExitFrame):
                                a.exit = frame
                except LauncherRefused as exc:
                    cls = FailureClass.SANDBOX
                    a.launcher_failure = Failure(cls, f"the sandbox refused the run: {exc}")
                except LauncherUnavailable as exc:
                    # The machine's fault, not the messages': retried, never set aside.
                    a.launcher_failure = Failure(
                        FailureClass.PROCESS_CRASHED,
                        f"the sandbox launcher was lost: {exc}",
                        environment=True,
                    )
                except LauncherError as exc:
                    a.launcher_failure = Failure(
                        FailureClass.PROCESS_CRASHED, f"the sandbox launcher misbehaved: {exc}"
                    )
            tg.cancel_scope.cancel()
        return a

    def _run_request(self, run_id: str, session_id: str | None) -> RunRequest:
        """The typed run request; the wire model checks it as the launcher would."""
        turn, request, paths = self.turn, self.turn.request, self.turn.paths
        return RunRequest(
            run_id=run_id,
            agent_id=request.agent_id,
            agent_dir=str(paths.agent_dir),
            runtime_dir=str(paths.runtime_dir),
            bin_dir=str(turn.bin_dir),
            interpreter_dirs=turn.interpreter_dirs,
            model=request.model,
            session_id=session_id,
            env=turn.env,
            stdin=request.render_input(session_id is None),
            stdout_limit=turn.stdout_limit,
            loopback_ports=turn.ports,
            egress=EgressWire.of(turn.egress),
            engine_args=EngineArgs(
                session_id=session_id,
                model=request.model,
                title=TURN_TITLE,
                dir=str(paths.work_dir),
            ),
        )

    async def settle(self, last: Attempt) -> bool:
        """Nothing to add: the launcher's exit frame already said it all."""
        return False

    @staticmethod
    async def _unverified(
        check: OutputCheck, finding: str, request: TurnRequest, on_event: EventSink
    ) -> None:
        log.warning("agent %s: the engine's output held %s", request.agent_id, finding)
        marker = check.record(finding)
        if marker is not None:
            await on_event(marker)


def _first_error(exc: ValidationError) -> str:
    """The first thing the wire model refused, without the value (it may hold a secret)."""
    error = exc.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}"
