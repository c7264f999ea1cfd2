"""The Computer service's life: serve → startup → main loop → shutdown (computer.md §1).

`ComputerService.serve()` reads top-down like uvicorn's server: `startup`
connects upstream, prints `ready`, opens the introspection socket, starts the
launcher and prepares this run's directory; `main_loop` reports the models and
follows the server's event stream (sync agents, wake runners) until stdin
closes, a signal arrives or a step fails for good (`_fail`: exit 1 after the
stop); `shutdown` stops the runners, the launcher, the socket, and removes the
run directory. Every task has an owner: the task groups in `serve`.

The machinery that touches the machine (launcher, directories, engine) sits
behind `Parts`, so tests and benchmarks can drive the same service.
"""

from __future__ import annotations

import logging
import os
import platform
import random
import signal
import socket
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

import anyio
import httpx
import orjson
from anyio.abc import TaskGroup
from httpx_sse import ServerSentEvent, SSEError

from computer_service.bootstrap import Bootstrap
from computer_service.engine.base import Engine
from computer_service.introspection import (
    AgentDetail,
    AgentRow,
    EngineHealth,
    EventBus,
    Health,
    IntrospectionServer,
    SandboxHealth,
    TurnSummary,
    create_app,
)
from computer_service.metrics import Metrics
from computer_service.runner import AgentWorkspace, Runner, TurnGate
from computer_service.upstream import (
    AgentRecord,
    Unauthorized,
    Upstream,
    UpstreamError,
    UpstreamRejected,
    UpstreamUnavailable,
)
from crew_common.unix_socket import SocketInUse

log = logging.getLogger(__name__)

VERSION = "0.1.0"
# Stopping a turn is SIGINT, then SIGKILL after 2 s, then a last report: give it room.
RUNNER_STOP_TIMEOUT_S = 10.0
BACKOFF_INITIAL_S = 0.5
BACKOFF_CAP_S = 30.0


class StartupFailed(Exception):
    """The Computer cannot start or go on (computer.md §1 steps 1, 4–6); exit 1 with this line."""


class ModelsFailed(Exception):
    """`opencode models` gave no list (it failed or took over 30 s): this run cannot go on."""


class AgentPreparationFailed(Exception):
    """One agent's directory or credential could not be prepared (reported for that agent)."""


@dataclass(frozen=True)
class LauncherStatus:
    """What the launcher's `/health` says (or why there is no launcher)."""

    sandbox_ok: bool | None
    backend: str | None
    reason: str | None
    engine_found: bool
    engine_version: str | None

    def unavailable_reason(self) -> str | None:
        """Why no agent can run, or None when the sandbox and the engine are usable."""
        if self.sandbox_ok is None:
            return "starting"
        if not self.sandbox_ok:
            return f"sandbox unavailable: {self.reason or 'the self-test failed'}"
        if not self.engine_found:
            return "engine unavailable: opencode not found (install OpenCode or set opencode_path)"
        return None


class Parts(Protocol):
    """The machine-facing parts the service drives (real: `LocalParts`)."""

    async def start_launcher(self) -> LauncherStatus:
        """Start the launcher and read its health; a launcher that cannot start is `ok: false`."""
        ...

    async def stop_launcher(self) -> None: ...

    async def launcher_exited(self) -> int:
        """Wait until the launcher dies on its own (never returns while there is none)."""
        ...

    async def models(self) -> list[str]:
        """`opencode models` through the launcher: the `provider/model` lines.

        Raises `ModelsFailed` when opencode itself gives no list; any other
        error (the launcher being replaced) is worth a retry.
        """
        ...

    def prepare_run_dir(self) -> None:
        """Clean `runtime/*`, create `runtime/<run-id>/`, write `bin/crew` (raises on failure)."""
        ...

    def remove_run_dir(self) -> None: ...

    def engine(self) -> Engine:
        """The engine runners use (only called when the launcher is usable)."""
        ...

    def prepare_agent(self, agent: AgentRecord, token: str) -> AgentWorkspace:
        """Create the agent's directories, token file and AGENTS.md (`AgentPreparationFailed`)."""
        ...


class Backoff:
    """Capped exponential backoff with jitter; the server's `retry:` sets the base."""

    def __init__(self, initial_s: float = BACKOFF_INITIAL_S, cap_s: float = BACKOFF_CAP_S):
        self.base_s = initial_s
        self.cap_s = cap_s
        self.attempt = 0

    def reset(self) -> None:
        """After a successful connect: start again from the base delay."""
        self.attempt = 0

    def server_retry(self, retry_ms: int) -> None:
        """Take the server's `retry:` (milliseconds) as the base delay."""
        self.base_s = min(max(retry_ms / 1000, 0.05), self.cap_s)

    def next_delay(self) -> float:
        """The next delay in seconds, doubled each time up to the cap, jittered."""
        delay = min(self.cap_s, self.base_s * 2**self.attempt)
        self.attempt = min(self.attempt + 1, 30)
        # Full jitter on the upper half: many Computers do not reconnect in lockstep.
        return delay * random.uniform(0.5, 1.0)


class ComputerService:
    """One Computer: its runners, its event stream and its introspection socket."""

    def __init__(
        self,
        bootstrap: Bootstrap,
        parts: Parts,
        *,
        upstream: Upstream | None = None,
        stdout: BinaryIO | None = None,
        stdin_fd: int | None = None,
        handle_signals: bool = True,
    ) -> None:
        self.bootstrap = bootstrap
        self.crew_home = bootstrap.resolved_crew_home()
        self.parts = parts
        self.upstream = upstream or Upstream(bootstrap.server_url, bootstrap.token)
        self.metrics = Metrics()
        self.gate = TurnGate(bootstrap.turn_capacity())
        self.metrics.queue_length = lambda: self.gate.queued
        self.metrics.running_turns = lambda: self.gate.running
        self.bus = EventBus()
        self.runners: dict[str, Runner] = {}
        self.problems: dict[str, tuple[AgentRecord, str]] = {}
        # Agents whose turn was fenced out: no runner until the next full sync.
        self.fenced: set[str] = set()
        self.connected = False
        self.ready = False
        self.launcher = LauncherStatus(None, None, "the launcher is starting", False, None)
        self.unavailable: str | None = "starting"
        self.stop_requested = anyio.Event()
        self._stdout = stdout
        self._stdin_fd = stdin_fd
        self._handle_signals = handle_signals
        self._runner_group: TaskGroup | None = None
        self._engine: Engine | None = None
        self._introspection: IntrospectionServer | None = None
        self._last_event_id: str | None = None
        # Reconnects of the event stream (and model reports) wait this long between tries.
        self.event_backoff = Backoff()
        # Why this run cannot go on (steps 5-6 failed after start): serve() raises it.
        self.failure: str | None = None
        self.synced = anyio.Event()

    # --- life ----------------------------------------------------------------

    async def serve(self) -> int:
        """Run until stopped: 0 after an orderly stop; raises `StartupFailed` when it cannot start.

        Stop requests are watched from the first moment, so a SIGTERM during a
        slow start (the launcher's self-test) still stops in order.
        """
        failed: StartupFailed | None = None
        async with anyio.create_task_group() as watchers:
            watchers.start_soon(self._watch_stdin)
            if self._handle_signals:
                watchers.start_soon(self._watch_signals)
            try:
                with anyio.CancelScope() as starting:
                    watchers.start_soon(self._cancel_on_stop, starting)
                    await self.startup()
                if not self.stop_requested.is_set():
                    await self.main_loop()
            except StartupFailed as exc:
                log.error("%s", exc)
                failed = exc
            finally:
                await self.shutdown()
                watchers.cancel_scope.cancel()
        if failed is not None:
            raise failed
        if self.failure is not None:
            raise StartupFailed(self.failure)
        return 0

    async def _cancel_on_stop(self, scope: anyio.CancelScope) -> None:
        await self.stop_requested.wait()
        scope.cancel()

    async def startup(self) -> None:
        """Connect, say `ready`, open the socket, start the launcher, prepare the run dir."""
        await self._connect()
        self._say_ready()
        self._make_crew_home()
        await self._open_introspection()
        self.launcher = await self.parts.start_launcher()
        self.unavailable = self.launcher.unavailable_reason()
        if self.unavailable:
            log.warning("no agent can run on this Computer: %s", self.unavailable)
        try:
            self.parts.prepare_run_dir()
        except (OSError, ValueError) as exc:
            raise StartupFailed(f"cannot prepare the run directory: {exc}") from exc
        if self.unavailable is None:
            self._engine = self.parts.engine()

    async def main_loop(self) -> None:
        """Follow the event stream and run turns until stdin closes, SIGTERM or SIGINT."""
        async with anyio.create_task_group() as runner_group:
            self._runner_group = runner_group
            async with anyio.create_task_group() as tasks:
                if self.unavailable is None:
                    tasks.start_soon(self._report_models)
                    tasks.start_soon(self._keep_launcher)
                tasks.start_soon(self._follow_events)
                await self.stop_requested.wait()
                # Abort the event stream and the sync at once…
                tasks.cancel_scope.cancel()
            # …and every runner: running turns are stopped and recorded as cancelled.
            for runner in list(self.runners.values()):
                runner.close()
            with anyio.move_on_after(RUNNER_STOP_TIMEOUT_S) as waiting:
                for runner in list(self.runners.values()):
                    await runner.finished.wait()
            if waiting.cancelled_caught:
                log.warning(
                    "runners did not stop within %.0f s; cancelling them", RUNNER_STOP_TIMEOUT_S
                )
                runner_group.cancel_scope.cancel()

    async def shutdown(self) -> None:
        """Stop the launcher, remove this run's directory, then the socket (each step logged)."""
        with anyio.CancelScope(shield=True):
            try:
                await self.parts.stop_launcher()
            except Exception:
                log.exception("stopping the launcher failed")
            try:
                self.parts.remove_run_dir()
            except OSError as exc:
                log.warning("removing the run directory failed: %s", exc)
            # Last: introspection answers until the very end (its /events streams end now).
            self.bus.close()
            if self._introspection is not None:
                try:
                    await self._introspection.stop()
                except OSError as exc:
                    log.warning("removing the introspection socket failed: %s", exc)
            await self.upstream.aclose()

    def request_stop(self) -> None:
        """Ask for an orderly stop (what stdin closing and the signals do)."""
        self.stop_requested.set()

    def _fail(self, reason: str) -> None:
        """Stop in order, then exit 1 with `reason`: never idle in a broken state (§1)."""
        log.error("%s", reason)
        if self.failure is None:
            self.failure = reason
        self.request_stop()

    # --- startup steps -------------------------------------------------------

    async def _connect(self) -> None:
        try:
            answer = await self.upstream.connect(
                hostname=socket.gethostname(),
                platform=platform.system().lower(),
                version=VERSION,
                capacity=self.gate.capacity,
            )
        except UpstreamError as exc:
            raise StartupFailed(f"cannot connect to the crew server: {exc}") from exc
        log.info("connected as computer %s (epoch %d)", answer.computer_id, answer.epoch)

    def _make_crew_home(self) -> None:
        try:
            self.crew_home.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupFailed(f"cannot prepare the crew home {self.crew_home}: {exc}") from exc
        if not self.crew_home.is_dir():
            raise StartupFailed(f"cannot prepare the crew home {self.crew_home}: not a directory")

    def _say_ready(self) -> None:
        if self._stdout is not None:
            try:
                self._stdout.write(b"ready\n")
                self._stdout.flush()
            except OSError as exc:
                # Nobody reads stdout any more; stdin closing will say when to stop.
                log.warning("could not write ready to stdout: %s", exc)
        self.ready = True

    async def _open_introspection(self) -> None:
        server = IntrospectionServer(
            create_app(self, self.bus), self.crew_home / "sockets" / "computer.sock"
        )
        try:
            await server.start()
        except (OSError, SocketInUse) as exc:
            raise StartupFailed(f"cannot open the introspection socket: {exc}") from exc
        self._introspection = server

    async def _report_models(self) -> None:
        """Step 5: `opencode models`, reported upstream; exit 1 if there is no list to report.

        A launcher being replaced or a server that cannot be reached is tried
        again with backoff; opencode failing or the server refusing is final.
        """
        # Paced like the event stream's reconnects.
        backoff = Backoff(initial_s=self.event_backoff.base_s, cap_s=self.event_backoff.cap_s)
        models: list[str] | None = None
        while True:
            try:
                if models is None:
                    models = await self.parts.models()
                await self.upstream.put_models(models)
            except ModelsFailed as exc:
                self._fail(f"cannot read the available models: {exc}")
                return
            except UpstreamUnavailable as exc:
                log.warning("reporting the available models failed: %s; retrying", exc)
            except UpstreamError as exc:
                self._fail(f"the crew server refused the list of models: {exc}")
                return
            except Exception as exc:
                log.warning("reading the available models failed: %s; retrying", exc)
            else:
                log.info("reported %d models", len(models))
                return
            await anyio.sleep(backoff.next_delay())

    async def _keep_launcher(self) -> None:
        """A launcher that dies is replaced; its running turns fail as `process_crashed`."""
        backoff = Backoff(initial_s=0.5, cap_s=30)
        while True:
            code = await self.parts.launcher_exited()
            log.error("the sandbox launcher died (exit status %s); starting a new one", code)
            await anyio.sleep(backoff.next_delay())
            self.launcher = await self.parts.start_launcher()
            reason = self.launcher.unavailable_reason()
            if reason is not None:
                log.error("the new launcher is not usable either: %s", reason)
            else:
                backoff.reset()

    # --- stop requests -------------------------------------------------------

    async def _watch_stdin(self) -> None:
        """Stdin closing means stop (the desktop app went away)."""
        fd = self._stdin_fd
        if fd is None:
            await anyio.sleep_forever()
            return
        was_blocking = os.get_blocking(fd)
        os.set_blocking(fd, False)
        try:
            while True:
                await anyio.wait_readable(fd)
                try:
                    data = os.read(fd, 4096)
                except BlockingIOError:
                    continue
                if not data:
                    log.info("stdin closed: stopping")
                    self.request_stop()
                    return
        finally:
            os.set_blocking(fd, was_blocking)

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                # SIGTERM: sent by `kill` and the desktop app; SIGINT: Ctrl+C.
                log.info("%s received: stopping", signal.Signals(signum).name)
                self.request_stop()
                return

    # --- the event stream ----------------------------------------------------

    async def _follow_events(self) -> None:
        """Step 6: follow `GET /computer/events`; after every (re)connect sync, then wake all.

        Reconnects wait with capped exponential backoff and jitter, from the
        server's `retry:`, and send `Last-Event-ID` so missed events replay. A
        refused token ends the run (exit 1): retrying cannot fix it.
        """
        backoff = self.event_backoff
        while True:
            opened = False
            try:
                async with self.upstream.events(self._last_event_id) as source:
                    opened = True
                    self.connected = True
                    await self.sync_agents()
                    self.wake_all()
                    delivered = False
                    async for event in source.aiter_sse():
                        if not delivered:
                            # Back to the base delay only once the stream works: one that
                            # a proxy closes right after the 200 still backs off.
                            backoff.reset()
                            delivered = True
                        if event.retry is not None:
                            backoff.server_retry(event.retry)
                        await self._on_event(event)
                        if event.id:
                            self._last_event_id = event.id
                log.warning("the event stream ended; reconnecting")
            except Unauthorized as exc:
                self._fail(f"the event stream stopped: {exc}")
                return
            except UpstreamRejected as exc:
                if opened:
                    log.warning("event stream: %s; reconnecting", exc)
                elif self._last_event_id is not None:
                    # Perhaps an id the server no longer takes: start afresh (the wake-all
                    # after connecting covers what the replay would have brought).
                    log.warning("event stream refused: %s; reconnecting without an id", exc)
                    self._last_event_id = None
                else:
                    self._fail(f"cannot subscribe to the crew server's events: {exc}")
                    return
            except (UpstreamError, httpx.HTTPError, SSEError) as exc:
                log.warning("event stream: %s; reconnecting", exc)
            finally:
                self.connected = False
            await anyio.sleep(backoff.next_delay())

    async def _on_event(self, event: ServerSentEvent) -> None:
        if event.event == "wake":
            agent_id = _agent_id_of(event.data)
            if agent_id is None:
                log.warning("ignored a malformed wake event: %.200r", event.data)
                return
            runner = self.runners.get(agent_id)
            if runner is not None:
                runner.wake()
            elif agent_id not in self.problems and agent_id not in self.fenced:
                # Not known yet (e.g. just assigned): a sync creates it; then wake it.
                await self.sync_agents()
                if (runner := self.runners.get(agent_id)) is not None:
                    runner.wake()
        elif event.event == "agents":
            # New runners may have messages waiting from before they existed.
            for runner in await self.sync_agents():
                runner.wake()
        elif event.event not in ("ping", "message"):
            log.info("ignored an unknown event %.50r", event.event)

    # --- agents and runners --------------------------------------------------

    async def sync_agents(self) -> list[Runner]:
        """Create, replace and drop runners to match the server's agent list; the new runners."""
        agents = {agent.id: agent for agent in await self.upstream.agents()}
        self.fenced.clear()
        for agent_id in [a for a in self.runners if a not in agents]:
            await self._drop_runner(agent_id)
        for agent_id in [a for a in self.problems if a not in agents]:
            del self.problems[agent_id]
        created: list[Runner] = []
        for agent in agents.values():
            current = self.runners.get(agent.id)
            if current is not None and current.agent.settings() == agent.settings():
                continue
            if current is not None:
                await self._drop_runner(agent.id)
            # Agents with a problem are tried again: a later success clears it.
            if (runner := await self._add_runner(agent)) is not None:
                created.append(runner)
        self.synced.set()
        return created

    async def _drop_runner(self, agent_id: str) -> None:
        runner = self.runners.pop(agent_id, None)
        if runner is None:
            return
        runner.close()
        with anyio.move_on_after(RUNNER_STOP_TIMEOUT_S):
            await runner.finished.wait()

    async def _add_runner(self, agent: AgentRecord) -> Runner | None:
        if self.unavailable is not None or self._engine is None:
            await self._report_problem(agent, self.unavailable or "engine unavailable")
            return None
        try:
            token = await self.upstream.issue_token(agent.id)
            workspace = self.parts.prepare_agent(agent, token)
        except UpstreamError as exc:
            log.warning("agent %s: issuing its token failed: %s", agent.handle, exc)
            return None
        except AgentPreparationFailed as exc:
            await self._report_problem(agent, str(exc))
            return None
        runner = Runner(
            agent,
            upstream=self.upstream,
            engine=self._engine,
            workspace=workspace,
            gate=self.gate,
            metrics=self.metrics,
            publish=self.bus.publish,
        )
        self.runners[agent.id] = runner
        assert self._runner_group is not None
        self._runner_group.start_soon(self._run_runner, runner)
        try:
            # Cleared also when set by an earlier run: the server keeps problems.
            await self.upstream.clear_problem(agent.id)
        except UpstreamError as exc:
            log.warning("agent %s: clearing its problem failed: %s", agent.handle, exc)
        self.problems.pop(agent.id, None)
        return runner

    async def _run_runner(self, runner: Runner) -> None:
        try:
            await runner.run()
        finally:
            if self.runners.get(runner.agent.id) is runner:
                # Fenced out: dropped until the next agent sync says otherwise.
                del self.runners[runner.agent.id]
                if runner.fenced_out:
                    self.fenced.add(runner.agent.id)

    async def _report_problem(self, agent: AgentRecord, reason: str) -> None:
        known = self.problems.get(agent.id)
        self.problems[agent.id] = (agent, reason)
        if known is not None and known[1] == reason:
            return
        log.warning("agent %s cannot run: %s", agent.handle, reason)
        try:
            await self.upstream.set_problem(agent.id, reason)
        except UpstreamError as exc:
            log.warning("agent %s: reporting its problem failed: %s", agent.handle, exc)

    def wake_all(self) -> None:
        """Wake every runner (after a (re)connect: messages may have arrived meanwhile)."""
        for runner in self.runners.values():
            runner.wake()

    # --- the introspection view (ComputerView) -------------------------------

    def health(self) -> Health:
        """`GET /health`."""
        return Health(
            ready=self.ready,
            connected=self.connected,
            sandbox=SandboxHealth(
                ok=self.launcher.sandbox_ok,
                backend=self.launcher.backend,
                reason=self.launcher.reason,
            ),
            engine=EngineHealth(
                found=self.launcher.engine_found, version=self.launcher.engine_version
            ),
            agents=len(self.runners) + len(self.problems),
            running_turns=self.gate.running,
            queued=self.gate.queued,
        )

    def agent_rows(self) -> list[AgentRow]:
        """`GET /agents`: runners and agents with a problem, by handle."""
        rows = [AgentRow.model_validate(runner.row()) for runner in self.runners.values()]
        rows += [_problem_row(agent, reason) for agent, reason in self.problems.values()]
        return sorted(rows, key=lambda row: row.handle)

    def agent_detail(self, agent_id: str) -> AgentDetail | None:
        """`GET /agents/{id}`; None for an unknown agent."""
        if (runner := self.runners.get(agent_id)) is not None:
            turns = [TurnSummary.model_validate(t) for t in runner.recent_turns()]
            return AgentDetail.model_validate({**runner.row(), "recent_turns": turns})
        if (problem := self.problems.get(agent_id)) is not None:
            row = _problem_row(*problem)
            return AgentDetail.model_validate({**row.model_dump(), "recent_turns": []})
        return None

    def wake_agent(self, agent_id: str) -> bool | None:
        """`POST /agents/{id}/wake`: None unknown, False cannot run, True woken."""
        if (runner := self.runners.get(agent_id)) is not None:
            runner.wake()
            return True
        return False if agent_id in self.problems else None

    def stop_agent(self, agent_id: str) -> bool | None:
        """`POST /agents/{id}/stop`: None unknown, False nothing running, True stopping."""
        if (runner := self.runners.get(agent_id)) is not None:
            return runner.stop_turn()
        return False if agent_id in self.problems else None


def _problem_row(agent: AgentRecord, reason: str) -> AgentRow:
    return AgentRow(
        id=agent.id,
        handle=agent.handle,
        state="problem",
        turn_id=None,
        pending_wake=False,
        last_result=None,
        last_reason=None,
        session_id=None,
        model=agent.model,
        problem=reason,
    )


def _agent_id_of(data: str) -> str | None:
    try:
        parsed: Any = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if isinstance(parsed, dict) and isinstance(parsed.get("agent_id"), str):
        return str(parsed["agent_id"])
    return None
