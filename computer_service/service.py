"""The Computer service's life: serve → startup → main loop → shutdown (computer.md §1).

`ComputerService.serve()` reads top-down like uvicorn's server: `startup`
connects upstream, prints `ready`, opens the introspection socket, starts the
launcher and prepares this run's directory; `main_loop` reports the models and
follows the server's event stream (`EventStream`, which keeps the `Roster` of
runners in step) until stdin closes, a signal arrives or a step fails for good
(`_fail`: exit 1 after the stop); `shutdown` stops the runners, the launcher,
the socket, and removes the run directory. Every task has an owner: the task
groups in `serve` and `main_loop`.

The machinery that touches the machine (launcher, directories, engine) sits
behind `Parts`, so tests and benchmarks can drive the same service.
"""

from __future__ import annotations

import logging
import os
import platform
import signal
import socket
import stat
from typing import BinaryIO

import anyio

from computer_service.bootstrap import Bootstrap
from computer_service.event_stream import SUPERSEDED, Backoff, EventStream
from computer_service.gate import TurnGate
from computer_service.home_lock import CrewHomeBusy, CrewHomeLock
from computer_service.introspection import (
    AgentDetail,
    AgentRow,
    EngineHealth,
    EventBus,
    Health,
    IntrospectionServer,
    SandboxHealth,
    WarmHealth,
    create_app,
)
from computer_service.metrics import Metrics
from computer_service.parts_protocol import LauncherStatus, ModelsFailed, Parts, StartupFailed
from computer_service.roster import Roster
from computer_service.upstream import Superseded, Upstream, UpstreamError, UpstreamUnavailable
from crew_common.unix_socket import SocketInUse
from crew_common.version import VERSION

log = logging.getLogger(__name__)


class ComputerService:
    """One Computer: its roster of runners, its event stream and its introspection socket."""

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
        self.metrics.event_readers = lambda: self.bus.readers
        self.metrics.events_missed = lambda: self.bus.missed_total
        self.roster = Roster(
            self.upstream,
            parts,
            gate=self.gate,
            metrics=self.metrics,
            publish=self.bus.publish,
            superseded=lambda: self._fail(SUPERSEDED),
            retry_base_s=bootstrap.retry_base_s,
            retry_window_s=bootstrap.upstream_retry_window_s,
            turn_time_limit_s=bootstrap.turn_time_limit_s,
        )
        self.events = EventStream(self.upstream, self.roster, fail=self._fail)
        self.ready = False
        self.launcher = LauncherStatus(None, None, "the launcher is starting", False, None)
        self.stop_requested = anyio.Event()
        self._stdout = stdout
        self._stdin_fd = stdin_fd
        self._handle_signals = handle_signals
        self._introspection: IntrospectionServer | None = None
        # Why this run cannot go on (steps 5-6 failed after start): serve() raises it.
        self.failure: str | None = None
        self._home_lock = CrewHomeLock(self.crew_home)

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
                # Not logged here: the reason is the one line the caller prints at exit.
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
        """Take the crew home, connect, say `ready`, open the socket, start the launcher,
        prepare the run dir."""
        # Before connecting: a second Computer on this crew home must not replace the
        # first one's connection upstream, and `ready` means the crew home is usable.
        self._make_crew_home()
        await self._connect()
        self._say_ready()
        await self._open_introspection()
        self.launcher = await self.parts.start_launcher()
        unavailable = self.launcher.unavailable_reason()
        if unavailable:
            # The service still runs: every agent is told why it cannot run here.
            log.warning("no agent can run on this Computer: %s", unavailable)
        try:
            self.parts.prepare_run_dir()
        except (OSError, ValueError) as exc:
            raise StartupFailed(f"cannot prepare the run directory: {exc}") from exc
        self.roster.unavailable = unavailable
        if unavailable is None:
            self.roster.engine = self.parts.engine()
            self.metrics.sections.append(self.roster.engine.metric_lines)

    async def main_loop(self) -> None:
        """Follow the event stream and run turns until stdin closes, SIGTERM or SIGINT."""
        # Leaving `running()` stops every runner: running turns end as cancelled.
        async with self.roster.running(), anyio.create_task_group() as tasks:
            if self.launcher.engine_found:
                # `opencode models` runs outside the sandbox: the models are reported
                # even when the sandbox is unusable, so a user can fix one thing at a time.
                tasks.start_soon(self._report_models)
            if self.roster.unavailable is None:
                tasks.start_soon(self._keep_launcher)
            if self.roster.engine is not None:
                # The engine's housekeeping (idle warm servers); cleans up when the loop ends.
                tasks.start_soon(self.roster.engine.maintain)
            tasks.start_soon(self.events.follow)
            await self.stop_requested.wait()
            # Abort the event stream and the sync at once; the runners stop after them.
            tasks.cancel_scope.cancel()

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
            self._home_lock.release()

    def request_stop(self) -> None:
        """Ask for an orderly stop (what stdin closing and the signals do)."""
        self.stop_requested.set()

    def _fail(self, reason: str) -> None:
        """Stop in order, then exit 1 with `reason`: never idle in a broken state (§1)."""
        # The reason itself is the one line printed at exit (`serve` raises it), not twice.
        log.info("this run cannot go on: stopping in order")
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
        try:
            self._home_lock.acquire()
        except CrewHomeBusy as exc:
            raise StartupFailed(str(exc)) from exc
        except OSError as exc:
            raise StartupFailed(f"cannot lock the crew home {self.crew_home}: {exc}") from exc

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

        A launcher being replaced (or replaced by an unusable one) or a server
        that cannot be reached is tried again with backoff; opencode failing
        under a usable launcher, or the server refusing, is final.
        """
        # Paced like the event stream's reconnects.
        backoff = Backoff(initial_s=self.events.backoff.base_s, cap_s=self.events.backoff.cap_s)
        models: list[str] | None = None
        while True:
            try:
                if models is None:
                    models = await self.parts.models()
                await self.upstream.put_models(models)
            except ModelsFailed as exc:
                if self.launcher.unavailable_reason() is None:
                    self._fail(f"cannot read the available models: {exc}")
                    return
                # A replacement launcher that is not usable: the next usable one may list them.
                log.warning("reading the available models failed: %s; retrying", exc)
            except Superseded:
                self._fail(SUPERSEDED)
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
        """A launcher that dies is replaced; its running turns fail as `process_crashed`.

        A replacement that is not usable makes every agent a problem with its
        reason; another one is started after a backoff, and the first usable
        one prepares the agents again.
        """
        backoff = Backoff(initial_s=0.5, cap_s=30)
        usable = True
        while True:
            if usable:
                code = await self.parts.launcher_exited()
                log.error("the sandbox launcher died (exit status %s); starting a new one", code)
            await anyio.sleep(backoff.next_delay())
            self.launcher = await self.parts.start_launcher()
            reason = self.launcher.unavailable_reason()
            was_usable, usable = usable, reason is None
            if reason is not None:
                log.error("the new launcher is not usable either: %s; trying again", reason)
                await self.roster.launcher_unusable(reason)
                continue
            backoff.reset()
            if not was_usable:
                log.info("a usable launcher is back: preparing the agents again")
                try:
                    await self.roster.launcher_usable()
                except UpstreamError as exc:
                    # The event stream's next (re)connect syncs and wakes them.
                    log.warning("syncing the agents after the launcher came back failed: %s", exc)

    # --- stop requests -------------------------------------------------------

    async def _watch_stdin(self) -> None:
        """Stdin closing means stop (the desktop app went away).

        Only a pipe, socket or terminal closes: a regular file (`crew-computer <
        boot.json`, systemd's `StandardInput=file:`) is at its end from the start,
        and that asks for nothing — SIGTERM stops that Computer.
        """
        fd = self._stdin_fd
        if fd is None or not _can_close(fd):
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

    # --- the introspection view (ComputerView) -------------------------------

    def health(self) -> Health:
        """`GET /health`."""
        return Health(
            version=VERSION,
            server_url=self.bootstrap.server_url,
            ready=self.ready,
            connected=self.events.connected,
            connected_since=self.events.connected_since,
            sandbox=SandboxHealth(
                ok=self.launcher.sandbox_ok,
                backend=self.launcher.backend,
                reason=self.launcher.reason,
                not_granted=list(self.launcher.not_granted),
                network=self.launcher.network,
            ),
            engine=EngineHealth(
                found=self.launcher.engine_found,
                version=self.launcher.engine_version,
                reason=self.launcher.engine_reason(),
            ),
            agents=self.roster.agent_count,
            running_turns=self.gate.running,
            queued=self.gate.queued,
            warm=self._warm_health(),
        )

    def _warm_health(self) -> WarmHealth | None:
        engine = self.roster.engine
        health = engine.health() if engine is not None else None
        return WarmHealth.model_validate(health) if health is not None else None

    def agent_rows(self) -> list[AgentRow]:
        """`GET /agents`: runners and agents with a problem, by handle."""
        return self.roster.agent_rows()

    def agent_detail(self, agent_id: str) -> AgentDetail | None:
        """`GET /agents/{id}`; None for an unknown agent."""
        return self.roster.agent_detail(agent_id)

    async def wake_agent(self, agent_id: str) -> bool | None:
        """`POST /agents/{id}/wake`: None unknown, False cannot run, True woken."""
        return await self.roster.wake_agent(agent_id)

    def stop_agent(self, agent_id: str) -> bool | None:
        """`POST /agents/{id}/stop`: None unknown, False nothing running, True stopping."""
        return self.roster.stop_agent(agent_id)


def _can_close(fd: int) -> bool:
    """Whether `fd` is a stream whose end means the writer went away (pipe, socket, tty)."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)
