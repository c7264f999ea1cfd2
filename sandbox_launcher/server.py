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
import stat
import struct
import sys
from pathlib import Path
from types import FrameType

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from sandbox_launcher.app import create_app
from sandbox_launcher.backend import open_backend
from sandbox_launcher.bwrap import LinuxMode
from sandbox_launcher.engine_run import become_subreaper
from sandbox_launcher.launcher import (
    Launcher,
    LauncherConfig,
    engine_version,
    find_opencode,
)
from sandbox_launcher.schema import EngineHealth, SandboxHealth
from sandbox_launcher.selftest import self_test

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_SOL_LOCAL = 0  # macOS getsockopt level for LOCAL_PEERCRED
_LOCAL_PEERCRED = 1
SHUTDOWN_GRACE_S = 6.0  # a stop takes ≤ 2 s, the group clean-up ≤ 2 s more


class LauncherExit(Exception):
    """The launcher cannot start; the message goes to stderr and the exit status is 2."""


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (None if unknown)."""
    try:
        if sys.platform.startswith("linux"):
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return int(struct.unpack("3i", creds)[1])
        if sys.platform == "darwin":
            # struct xucred { u_int cr_version; uid_t cr_uid; short cr_ngroups; gid_t cr_groups[16]; }
            creds = sock.getsockopt(_SOL_LOCAL, _LOCAL_PEERCRED, 4 + 4 + 2 + 2 + 16 * 4)
            return int(struct.unpack_from("=II", creds)[1])
    except OSError as exc:
        log.warning("cannot read the peer credentials of a connection: %s", exc)
    return None


def peer_checked_protocol(allowed_uid: int) -> type[H11Protocol]:
    """An HTTP protocol that closes every connection whose peer is another user."""

    class PeerCheckedH11(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            uid = peer_uid(sock) if sock is not None else None
            if uid != allowed_uid:
                log.warning("refused a connection from uid %s (only uid %s)", uid, allowed_uid)
                transport.close()

    return PeerCheckedH11


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


def private_dir(path: Path) -> None:
    """Create `path` 0700 or check an existing one: a real directory of ours, made 0700."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise LauncherExit(f"{path} must be a directory (not a symlink or file)")
    if st.st_uid != os.getuid():
        raise LauncherExit(f"{path} belongs to uid {st.st_uid}, not to us; refusing to use it")
    os.chmod(path, 0o700)


def listen(path: Path) -> socket.socket:
    """A listening Unix socket at `path`, 0600, in a 0700 directory."""
    private_dir(path.parent)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)  # a stale socket from a launcher that died
        else:
            raise LauncherExit(f"{path} exists and is not a socket; refusing to replace it")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    sock.listen(64)
    sock.setblocking(False)
    return sock


def build_launcher(
    crew_home: Path, run_id: str, opencode: str | None, mode: LinuxMode | None
) -> Launcher:
    """Find the backend, run the self-test and `opencode --version` (side by side)."""
    home = Path(os.path.realpath(os.path.expanduser("~")))
    crew_home = Path(os.path.realpath(crew_home))  # a symlinked crew home is the user's choice
    private_dir(crew_home)
    private_dir(crew_home / "sockets")
    engine_path = find_opencode(opencode)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        version = pool.submit(engine_version, engine_path) if engine_path else None
        backend, health = open_backend(mode)
        if backend is not None:
            reason = self_test(backend, home, crew_home)
            if reason is not None:
                health = SandboxHealth(ok=False, backend=health.backend, reason=reason)
                backend = None
        engine = EngineHealth(path=str(engine_path), version=version.result()) if version else None
    if not health.ok:
        log.error("sandbox unavailable: %s", health.reason)
    config = LauncherConfig(crew_home=crew_home, home=home, run_id=run_id, opencode=engine_path)
    return Launcher(config=config, backend=backend, sandbox=health, engine=engine)


async def _serve(launcher: Launcher, secret: str, sock: socket.socket) -> None:
    config = uvicorn.Config(
        create_app(launcher, secret),
        http=peer_checked_protocol(os.getuid()),
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
    crew_home: Path, run_id: str, socket_path: Path, opencode: str | None, mode: LinuxMode | None
) -> int:
    """`crew-launcher serve`: run until stdin closes; 0 on an orderly stop."""
    secret = read_secret()
    set_parent_death_signal()
    become_subreaper()
    launcher = build_launcher(crew_home, run_id, opencode, mode)
    sock = listen(socket_path)
    try:
        asyncio.run(_serve(launcher, secret, sock))
    finally:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
    return 0
