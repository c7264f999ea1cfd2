"""`LocalParts`: the real machine-facing parts of the service (launcher, directories, engine).

The service drives these through its `Parts` interface; tests and benchmarks
may swap in their own. Nothing here decides *when*: only *how*.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import AsyncGenerator, Mapping

import anyio

from computer_service import safe_fs
from computer_service.bootstrap import TOKEN_ENV, Bootstrap
from computer_service.engine.base import Engine
from computer_service.engine.cold_run import ColdRun
from computer_service.engine.opencode_env import model_listing_env
from computer_service.engine.pipeline import OpenCodeEngine
from computer_service.engine.preparation import PRICE_TABLE_LIMIT, Preparation
from computer_service.engine.user_opencode import UserOpenCode, referenced_variables
from computer_service.engine.warm_pool import WarmPool, default_memory_budget
from computer_service.engine.warm_run import WarmRun
from computer_service.gateway.gateway import Gateway
from computer_service.home import AgentHome, AgentHomeError
from computer_service.launcher_client import (
    LauncherClient,
    LauncherError,
    LauncherNotListening,
    LauncherUnavailable,
)
from computer_service.launcher_process import LauncherProcess, launcher_argv
from computer_service.parts_protocol import (
    AgentPreparationFailed,
    LauncherStatus,
    ModelsFailed,
    StartupFailed,
)
from computer_service.run_dir import RunDirectory, RunDirectoryError
from computer_service.safe_fs import UnsafePath
from computer_service.upstream import AgentRecord
from crew_common.launcher_wire import (
    DeniedFrame,
    Frame,
    ModelsRequest,
    RunRequest,
    ServerInfo,
    ServerRequest,
)
from crew_common.layout import AgentPaths
from crew_common.unix_socket import remove_dead_sockets

log = logging.getLogger(__name__)

# A run that starts while the launcher is being replaced waits this long for the new one.
REPLACEMENT_WAIT_S = 30.0
_REPLACEMENT_POLL_S = 0.1


def launcher_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The launcher's environment: the Computer's, without the Computer's token or model keys.

    The launcher needs the user's environment (`opencode models` and
    `--version` run in it, with the proxies in it), never the token: its
    children and everything that reads `/proc/<launcher>/environ` would have
    it (issue 20). Nor the variables the user's OpenCode config names as
    `{env:VAR}` keys: only the model gateway, in this process, uses them.
    """
    keys = referenced_variables(UserOpenCode.from_env(environ).config_files)
    return {
        name: value for name, value in environ.items() if name != TOKEN_ENV and name not in keys
    }


def models_request(environ: Mapping[str, str]) -> ModelsRequest:
    """What `opencode models` needs of the user's OpenCode setup, read here, not by the launcher.

    The login and `provider` section exactly as a turn gets them, and the
    user's price table (the model catalog); a table that cannot be read is
    left out (logged): the listing then shows fewer models, it does not fail.
    """
    user = UserOpenCode.from_env(environ)
    try:
        prices = safe_fs.read_trusted_file(user.price_table, PRICE_TABLE_LIMIT)
    except UnsafePath as exc:
        log.warning("opencode models without your price table: %s", exc)
        prices = None
    price_table = None
    if prices is not None:
        try:
            price_table = prices.decode("utf-8")
        except UnicodeDecodeError:
            log.warning(
                "opencode models without your price table: %s is not UTF-8", user.price_table
            )
    return ModelsRequest(env=model_listing_env(user, environ), price_table=price_table)


class CurrentLauncher:
    """The engine's view of the launcher: whichever launcher process is current.

    A launcher that died is replaced by a new process with a new socket and
    secret; the engine keeps this one object. A run that starts meanwhile waits
    for the replacement (up to `replacement_wait_s`) instead of failing.
    """

    def __init__(self, parts: LocalParts, replacement_wait_s: float = REPLACEMENT_WAIT_S) -> None:
        self._parts = parts
        self._replacement_wait_s = replacement_wait_s

    async def run(self, request: RunRequest) -> AsyncGenerator[Frame, None]:
        """`POST /runs` on the current launcher; its frames, the last one `exit`."""
        deadline = anyio.current_time() + self._replacement_wait_s
        dead: LauncherClient | None = None
        while True:
            client = await self._client_other_than(dead, deadline)
            try:
                # aclosing: closing this stream early must close the launcher's, which stops the run.
                async with contextlib.aclosing(client.run(request)) as frames:
                    async for frame in frames:
                        yield frame
                return
            except LauncherNotListening as exc:
                if anyio.current_time() >= deadline:
                    raise
                # The request was never sent: the launcher died and is being replaced.
                # (A launcher lost once the run was sent is not run again here: the
                # turn fails and the runner tries again with backoff.)
                log.info("the launcher cannot be reached (%s); waiting for its replacement", exc)
                dead = client

    async def _client_other_than(
        self, dead: LauncherClient | None, deadline: float
    ) -> LauncherClient:
        while True:
            client = self._parts.client
            if client is not None and client is not dead:
                return client
            if anyio.current_time() >= deadline:
                raise LauncherUnavailable(
                    "the sandbox launcher is not running (it is being restarted)"
                )
            await anyio.sleep(_REPLACEMENT_POLL_S)

    async def stop(self, run_id: str) -> None:
        """Stop a run on the current launcher (none: nothing to stop)."""
        client = self._parts.client
        if client is not None:
            await client.stop(run_id)

    # ---- warm servers: they live in one launcher process and die with it ----

    def generation(self) -> object:
        """The current launcher client: a new one means every warm server is gone."""
        return self._parts.client

    def _current(self) -> LauncherClient:
        client = self._parts.client
        if client is None:
            raise LauncherUnavailable("the sandbox launcher is not running (it is being restarted)")
        return client

    async def start_server(self, request: ServerRequest) -> ServerInfo:
        """`POST /servers` on the current launcher."""
        return await self._current().start_server(request)

    async def sweep_server(self, agent_id: str) -> tuple[int, int | None]:
        """`POST /servers/{id}/sweep` on the current launcher."""
        return await self._current().sweep_server(agent_id)

    async def server_limit_hit(self, agent_id: str) -> str | None:
        """`GET /servers/{id}/limit` on the current launcher."""
        return await self._current().server_limit_hit(agent_id)

    async def server_denials(self, agent_id: str) -> list[DeniedFrame]:
        """`POST /servers/{id}/denials` on the current launcher."""
        return await self._current().server_denials(agent_id)

    async def stop_server(self, agent_id: str) -> None:
        """`POST /servers/{id}/stop` on the current launcher (none: nothing to stop)."""
        client = self._parts.client
        if client is not None:
            await client.stop_server(agent_id)

    async def servers(self) -> list[ServerInfo]:
        """`GET /servers` on the current launcher (none: no servers)."""
        client = self._parts.client
        return await client.servers() if client is not None else []


class LocalParts:
    """The launcher as a child process, `runtime/<run-id>/`, agent homes and `OpenCodeEngine`."""

    def __init__(self, bootstrap: Bootstrap, *, run_id: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.crew_home = bootstrap.resolved_crew_home()
        # Short: it is part of the launcher socket path (Unix socket paths are limited to ~104 bytes).
        self.run_id = run_id or uuid.uuid4().hex[:16]
        self.run_dir = RunDirectory(self.crew_home, self.run_id)
        self._launchers = 0
        self._process: LauncherProcess | None = None
        self.client: LauncherClient | None = None
        self._backend: str | None = None

    async def start_launcher(self) -> LauncherStatus:
        """Start a launcher and read its health; one that cannot start means no sandbox."""
        await self.stop_launcher()
        # Launchers that were killed (this run's earlier ones, or a crashed run's) leave
        # their sockets behind; only those nobody listens on go.
        try:
            for name in remove_dead_sockets(self.crew_home / "sockets", "launcher-*.sock"):
                log.info("removed the socket %s of a launcher that is gone", name)
        except OSError as exc:
            log.warning("could not remove the sockets of launchers that are gone: %s", exc)
        self._launchers += 1
        # A restarted launcher gets a socket of its own: the dead one's may linger.
        suffix = "" if self._launchers == 1 else f"-{self._launchers}"
        socket_path = self.crew_home / "sockets" / f"launcher-{self.run_id}{suffix}.sock"
        opencode = self.bootstrap.opencode_path
        argv = launcher_argv(
            self.crew_home,
            self.run_id,
            socket_path,
            mode=self.bootstrap.sandbox_mode,
            opencode_path=str(opencode) if opencode is not None else None,
            read_only_roots=tuple(self.bootstrap.read_only_roots),
            limit_args=self.bootstrap.turn_limits.launcher_args(),
        )
        process = LauncherProcess(argv, socket_path, env=launcher_env(os.environ))
        self._process = process
        try:
            await process.start()
            self.client = process.client()
            health = await self.client.health()
        except LauncherError as exc:
            log.error("the sandbox launcher is not usable: %s", exc)
            return LauncherStatus(False, None, f"the sandbox launcher failed: {exc}", False, None)
        engine = health.engine
        self._backend = health.sandbox.backend
        return LauncherStatus(
            sandbox_ok=health.sandbox.ok,
            backend=health.sandbox.backend,
            reason=health.sandbox.reason,
            engine_found=engine is not None and bool(engine.path),
            engine_version=engine.version if engine is not None else None,
            not_granted=tuple(health.sandbox.not_granted),
            network=health.sandbox.network,
        )

    async def stop_launcher(self) -> None:
        """Close the client, then stop the launcher process (stdin, SIGTERM, SIGKILL)."""
        if self.client is not None:
            await self.client.aclose()
            self.client = None
        if self._process is not None:
            code = await self._process.stop()
            log.info("the launcher exited (%s)", code)
            self._process = None

    async def launcher_exited(self) -> int:
        """Wait until the current launcher process exits on its own; its exit status."""
        process = self._process
        if process is None or process.pid is None:
            await anyio.sleep_forever()
        assert process is not None
        return await process.wait()

    async def models(self) -> list[str]:
        """`opencode models` through the launcher; `ModelsFailed` when opencode gives no list.

        A launcher that is gone or being replaced raises `LauncherUnavailable` (worth a retry).
        """
        if self.client is None:
            raise LauncherUnavailable("the sandbox launcher is not running (it is being restarted)")
        request = await anyio.to_thread.run_sync(models_request, os.environ)
        try:
            return await self.client.models(request)
        except LauncherUnavailable:
            raise
        except LauncherError as exc:
            raise ModelsFailed(str(exc)) from exc

    def prepare_run_dir(self) -> None:
        """Clean `runtime/*`, create this run's dir and `bin/crew`; `StartupFailed` if not."""
        try:
            self.run_dir.prepare()
        except RunDirectoryError as exc:
            raise StartupFailed(str(exc)) from exc

    def remove_run_dir(self) -> None:
        """Delete this run's directory (logs, never raises)."""
        self.run_dir.remove()

    def engine(self) -> Engine:
        """The OpenCode engine, following whichever launcher is current: warm or cold."""
        launcher = CurrentLauncher(self)
        gateway = Gateway(token_endpoint_overrides=self.bootstrap.gateway_token_endpoints)
        preparation = Preparation(
            crew_home=self.crew_home,
            run_id=self.run_id,
            server_url=self.bootstrap.server_url,
            bin_dir=self.run_dir.bin_dir,
            interpreter_dirs=self.run_dir.interpreter_dirs(),
            loopback_ports=list(self.bootstrap.sandbox_loopback_ports),
            gateway=gateway,
        )
        cold = ColdRun(launcher)
        if self.engine_mode() == "cold":
            return OpenCodeEngine(preparation, cold, gateway=gateway)
        budget = self.bootstrap.warm_memory_mb
        pool = WarmPool(
            launcher,
            memory_budget=budget * 1024 * 1024 if budget is not None else default_memory_budget(),
            idle_timeout_s=float(self.bootstrap.warm_idle_timeout_s),
            server_ceiling=self.bootstrap.warm_server_max_mb * 1024 * 1024,
        )
        return OpenCodeEngine(preparation, WarmRun(cold, pool), gateway=gateway)

    def engine_mode(self) -> str:
        """The bootstrap's `engine_mode`, else warm where supported (Linux with bwrap)."""
        if self.bootstrap.engine_mode is not None:
            return self.bootstrap.engine_mode
        return "warm" if self._backend == "bwrap" else "cold"

    def prepare_agent(self, agent: AgentRecord, token: str) -> AgentHome:
        """Prepare the agent's home; `AgentPreparationFailed` with the reason if not."""
        home = AgentHome(AgentPaths(self.crew_home, self.run_id, agent.id), agent)
        try:
            home.prepare(token)
        except AgentHomeError as exc:
            raise AgentPreparationFailed(str(exc)) from exc
        return home
