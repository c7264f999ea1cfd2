"""`LocalParts`: the real machine-facing parts of the service (launcher, directories, engine).

The service drives these through its `Parts` interface; tests and benchmarks
may swap in their own. Nothing here decides *when*: only *how*.
"""

from __future__ import annotations

import logging
import uuid

from computer_service.bootstrap import Bootstrap
from computer_service.engine.base import AgentPaths, Engine
from computer_service.engine.opencode import OpenCodeEngine
from computer_service.home import AgentHome, AgentHomeError, RunDirectory
from computer_service.launcher_client import (
    LauncherClient,
    LauncherError,
    LauncherProcess,
    launcher_argv,
)
from computer_service.service import AgentPreparationFailed, LauncherStatus, StartupFailed
from computer_service.upstream import AgentRecord

log = logging.getLogger(__name__)


class LocalParts:
    """The launcher as a child process, `runtime/<run-id>/`, agent homes and `OpenCodeEngine`."""

    def __init__(self, bootstrap: Bootstrap, *, run_id: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.crew_home = bootstrap.resolved_crew_home()
        # Short: it is part of the launcher socket path (Unix socket paths are limited to ~104 bytes).
        self.run_id = run_id or uuid.uuid4().hex[:16]
        self.run_dir = RunDirectory(self.crew_home, self.run_id)
        self.launcher_socket = self.crew_home / "sockets" / f"launcher-{self.run_id}.sock"
        self._process: LauncherProcess | None = None
        self._client: LauncherClient | None = None

    async def start_launcher(self) -> LauncherStatus:
        """Start the launcher and read its health; one that cannot start means no sandbox."""
        opencode = self.bootstrap.opencode_path
        argv = launcher_argv(
            self.crew_home,
            self.run_id,
            self.launcher_socket,
            mode=self.bootstrap.sandbox_mode,
            opencode_path=str(opencode) if opencode is not None else None,
        )
        process = LauncherProcess(argv, self.launcher_socket)
        self._process = process
        try:
            await process.start()
            self._client = process.client()
            health = await self._client.health()
        except LauncherError as exc:
            log.error("the sandbox launcher is not usable: %s", exc)
            return LauncherStatus(False, None, f"the sandbox launcher failed: {exc}", False, None)
        engine = health.engine
        return LauncherStatus(
            sandbox_ok=health.sandbox.ok,
            backend=health.sandbox.backend,
            reason=health.sandbox.reason,
            engine_found=engine is not None and bool(engine.path),
            engine_version=engine.version if engine is not None else None,
        )

    async def stop_launcher(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._process is not None:
            code = await self._process.stop()
            log.info("the launcher exited (%s)", code)
            self._process = None

    async def models(self) -> list[str]:
        if self._client is None:
            return []
        return await self._client.models()

    def prepare_run_dir(self) -> None:
        try:
            self.run_dir.prepare()
        except AgentHomeError as exc:
            raise StartupFailed(str(exc)) from exc

    def remove_run_dir(self) -> None:
        self.run_dir.remove()

    def engine(self) -> Engine:
        assert self._client is not None, "engine() is only called with a usable launcher"
        return OpenCodeEngine(
            self._client,
            crew_home=self.crew_home,
            run_id=self.run_id,
            server_url=self.bootstrap.server_url,
            bin_dir=self.run_dir.bin_dir,
            interpreter_dirs=self.run_dir.interpreter_dirs(),
        )

    def prepare_agent(self, agent: AgentRecord, token: str) -> AgentHome:
        home = AgentHome(AgentPaths(self.crew_home, self.run_id, agent.id), agent)
        try:
            home.prepare(token)
        except AgentHomeError as exc:
            raise AgentPreparationFailed(str(exc)) from exc
        return home
