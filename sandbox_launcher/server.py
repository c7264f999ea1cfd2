"""Serving the launcher: a private Unix socket, peer-uid checked, tied to its parent.

Reads top-down like uvicorn's own server: `serve` → `prepare` (secret,
parent-death signal, self-test) → `listen` (socket 0600 in a 0700 dir) →
uvicorn until stdin closes or a signal arrives → stop the runs → remove the
socket.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from types import FrameType

import uvicorn

from crew_common.launcher_wire import EngineHealth, SandboxHealth
from crew_common.unix_socket import bind_private_socket, peer_checked_h11, private_dir
from sandbox_launcher.app import create_app
from sandbox_launcher.backend import open_backend
from sandbox_launcher.bwrap import HOST_SOCKET_PLACES, LinuxMode
from sandbox_launcher.engine_run import become_subreaper
from sandbox_launcher.launcher import (
    Launcher,
    LauncherConfig,
    engine_version,
    find_opencode,
)
from sandbox_launcher.limits import MIB, TurnLimits, find_cgroup_parents
from sandbox_launcher.mounts import unjudged_mounts
from sandbox_launcher.selftest import self_test
from sandbox_launcher.tool_shell import tool_shell_base
from sandbox_launcher.toolchains import read_only_roots, toolchain_roots

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
SHUTDOWN_GRACE_S = 6.0  # a stop takes ≤ 2 s, the group clean-up ≤ 2 s more


class LauncherExit(Exception):
    """The launcher cannot start; the message goes to stderr and the exit status is 2."""


class LauncherServer(uvicorn.Server):
    """uvicorn with our start and stop: `ready` once listening; runs stopped before shutdown."""

    def __init__(self, config: uvicorn.Config, launcher: Launcher) -> None:
        super().__init__(config)
        self.launcher = launcher
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit_requested: asyncio.Event | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            sys.stdout.write("ready\n")
            sys.stdout.flush()

    async def main_loop(self) -> None:
        # uvicorn looks at should_exit every 100 ms; an idle launcher should not
        # wake up at all, so it sleeps until request_exit() says otherwise.
        # Not public API: tests/common/test_uvicorn_pin.py checks it for the pinned uvicorn.
        self._exit_requested = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        await self.on_tick(0)  # the default headers, once (no Date header to keep fresh)
        if not self.should_exit:
            await self._exit_requested.wait()

    def request_exit(self) -> None:
        """Begin the orderly stop; safe from a signal handler and from the loop."""
        self.should_exit = True
        if self._loop is not None and self._exit_requested is not None:
            self._loop.call_soon_threadsafe(self._exit_requested.set)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Stop every run first: their response streams end when their engines do.
        for run in list(self.launcher.runs.values()):
            run.request_stop()
        for listing in list(self.launcher.listings):
            listing.cancel()
        await asyncio.to_thread(self.launcher.stop_servers)
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Sent by the Computer (SIGTERM), the parent-death signal, or Ctrl+C.
        # Unlike uvicorn we do not re-raise it afterwards: the exit is orderly.
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.request_exit()


def read_secret(stream: int = 0) -> str:
    """The bearer secret: the first line of stdin (the Computer keeps stdin open after it)."""
    line = bytearray()
    while not line.endswith(b"\n"):
        chunk = os.read(stream, 1)  # one byte at a time: never read past the line
        if not chunk:
            break
        line += chunk
        if len(line) > 4096:
            raise LauncherExit("the secret line on stdin is over 4096 bytes")
    secret = line.decode("utf-8", "replace").strip()
    if len(secret) < 16:
        raise LauncherExit(
            "expected the bearer secret (16+ characters) as the first line of stdin; "
            "the Computer starts the launcher this way (docs/contracts.md)"
        )
    return secret


def set_parent_death_signal() -> None:
    """Linux: SIGTERM us when the Computer dies (stdin closing covers macOS too)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %s", ctypes.get_errno())
    if os.getppid() == 1:
        raise LauncherExit("the parent process is already gone; not starting")


def listen(path: Path) -> socket.socket:
    """The private socket at `path` (0600 in a 0700 dir); `LauncherExit` when it is unusable."""
    try:
        return bind_private_socket(path)
    except OSError as exc:  # UnsafeSocketPath, SocketInUse, or the bind itself
        raise LauncherExit(f"cannot listen on {path}: {exc}") from exc


def build_launcher(
    crew_home: Path,
    run_id: str,
    opencode: str | None,
    mode: LinuxMode | None,
    read_only: tuple[str, ...] = (),
    limits: TurnLimits | None = None,
) -> Launcher:
    """Find the backend, run the self-test and `opencode --version` (side by side)."""
    limits = limits or TurnLimits()
    home = Path(os.path.realpath(os.path.expanduser("~")))
    crew_home = Path(os.path.realpath(crew_home))  # a symlinked crew home is the user's choice
    try:
        private_dir(crew_home)
        private_dir(crew_home / "sockets")
    except OSError as exc:
        raise LauncherExit(str(exc)) from exc
    engine_path = find_opencode(opencode)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        version = pool.submit(engine_version, engine_path) if engine_path else None
        backend, health = open_backend(mode, limits, tool_shell_base(crew_home))
        if backend is not None:
            reason = self_test(backend, home, crew_home)
            if reason is not None:
                health = SandboxHealth(ok=False, backend=health.backend, reason=reason)
                backend = None
        engine = EngineHealth(path=str(engine_path), version=version.result()) if version else None
    if not health.ok:
        log.error("sandbox unavailable: %s", health.reason)
    roots = toolchain_roots(os.environ.get("PATH", ""), home, crew_home, os.environ)
    extra = read_only_roots(list(read_only), home, crew_home)
    # Mounts that may show $HOME or the crew home but cannot be judged (a FUSE file system
    # of unknown origin): masked in every run, and said here (issue 20).
    linux = sys.platform.startswith("linux")
    hidden = tuple(map(Path, HOST_SOCKET_PLACES))
    unjudged = unjudged_mounts((home, crew_home), hidden) if linux else []
    not_granted = [*roots.refused, *extra.refused, *unjudged]
    health = health.model_copy(update={"not_granted": not_granted})
    config = LauncherConfig(
        crew_home=crew_home,
        home=home,
        run_id=run_id,
        opencode=engine_path,
        read_roots=tuple(dict.fromkeys([*roots.dirs, *extra.dirs])),
        rustup_home=roots.rustup_home,
    )
    cgroups = find_cgroup_parents() if sys.platform.startswith("linux") else None
    log.info(
        "run limits: %d processes, %d TCP connections, /dev/shm %d MiB, memory %s",
        limits.max_processes,
        limits.max_connections,
        limits.shm_bytes // MIB,
        f"{limits.memory_bytes // MIB} MiB (cgroup v{cgroups.version})"
        if cgroups
        else "not limited (no cgroup available; rlimits only)",
    )
    return Launcher(
        config=config,
        backend=backend,
        sandbox=health,
        engine=engine,
        limits=limits,
        cgroups=cgroups,
    )


async def _serve(launcher: Launcher, secret: str, sock: socket.socket) -> None:
    config = uvicorn.Config(
        create_app(launcher, secret),
        http=peer_checked_h11(os.getuid()),
        lifespan="off",
        log_config=None,
        access_log=False,
        date_header=False,  # a private API: no clock to keep on every answer
        timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
    )
    server = LauncherServer(config, launcher)
    loop = asyncio.get_running_loop()

    def on_stdin() -> None:
        try:
            data = os.read(0, 4096)
        except OSError as exc:
            log.info("stdin unreadable (%s); shutting down", exc)
            data = b""
        if not data:  # the Computer closed our stdin: it wants us gone
            loop.remove_reader(0)
            server.request_exit()

    loop.add_reader(0, on_stdin)
    try:
        await server.serve(sockets=[sock])
    finally:
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(0)


def serve(
    crew_home: Path,
    run_id: str,
    socket_path: Path,
    opencode: str | None,
    mode: LinuxMode | None,
    read_only: tuple[str, ...] = (),
    limits: TurnLimits | None = None,
) -> int:
    """`crew-launcher serve`: run until stdin closes; 0 on an orderly stop."""
    secret = read_secret()
    set_parent_death_signal()
    become_subreaper()
    launcher = build_launcher(crew_home, run_id, opencode, mode, read_only, limits)
    sock = listen(socket_path)
    try:
        asyncio.run(_serve(launcher, secret, sock))
    finally:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
    return 0
