"""One sandboxed engine process: start, stream its stdout lines, cap, stop, clean up.

Process rules (launcher.md): a new session and process group per run (also
no controlling terminal, so no TIOCSTI); stdin written then closed; stdout
over the limit kills the group (`output_too_large`); only the last 64 KiB of
stderr kept; stop = SIGINT to the group, SIGKILL after 2 s; after the leader
exits SIGTERM to the group, SIGKILL after 2 s. The run is over when the
leader has exited: a background child still holding the pipe cannot keep it
open (we read on for a short grace, then let go).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import anyio
import orjson
from anyio.abc import ByteReceiveStream, Process, SocketStream

from crew_common.launcher_wire import ExitFrame, RunInfo
from sandbox_launcher.limits import WATCH_INTERVAL_S, LimitHit, ResourceWatch, RunCgroup, TurnLimits
from sandbox_launcher.network import (
    NetworkUnavailable,
    SandboxExited,
    SandboxNetwork,
    sandbox_failure,
)

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
STOP_GRACE_S = 2.0
CLEANUP_GRACE_S = 2.0
DRAIN_GRACE_S = 1.0
DENIAL_POLL_S = 2.0  # how often a run's denials are read and sent while it runs
EXIT_GRACE_S = 2.0  # bwrap's exit after its sandbox ended before the network was up
GROUP_POLL_S = 0.05
STDERR_TAIL = 64 * 1024
READ_CHUNK = 64 * 1024

Emit = Callable[[bytes], Awaitable[None]]
StopReason = Literal["stopped", "output_too_large"] | LimitHit


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal a process group; False when it no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("cannot signal process group %s with %s: permission denied", pgid, sig)
        return False
    return True


def become_subreaper() -> None:
    """Linux: adopt our runs' orphans (bwrap's helper outlives its leader a moment).

    We reap them per group (`reap_group`); otherwise they would wait as zombies
    for an init that, in some containers, never reaps.
    """
    global _subreaper
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_CHILD_SUBREAPER) failed: errno %s", ctypes.get_errno())
        return
    _subreaper = True


# Once we are our runs' subreaper, every member of a run's group is a descendant of ours
# (a run is its own session: nothing else joins its group; its orphans come to us).
_subreaper = False
MAX_DESCENDANTS = 4096


def reap_group(pgid: int) -> None:
    """Reap our exited children in group `pgid` (only ever after its leader was waited for)."""
    while True:
        try:
            if os.waitid(os.P_PGID, pgid, os.WEXITED | os.WNOHANG) is None:
                return
        except ChildProcessError:
            return  # no children of ours left in that group


def group_alive(pgid: int) -> bool:
    """Does the group still have a live (non-zombie) member?

    `killpg(pgid, 0)` also succeeds for zombies: reap ours first, and when a
    member remains, look closer in /proc (a zombie of someone else's counts as gone).
    """
    reap_group(pgid)
    if not _signal_group(pgid, 0):
        return False
    if not os.path.isdir("/proc/self"):
        return True
    # Our descendants only, when that is all a group can hold: a few reads, not all of /proc.
    candidates = _descendants(os.getpid()) if _subreaper else None
    if candidates is None:
        candidates = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    for entry in candidates:
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid pgrp …" — comm may contain spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def _descendants(pid: int) -> list[int] | None:
    """Every descendant of `pid` (through each thread's `children`); None when that list
    cannot be read (no CONFIG_PROC_CHILDREN) or is too long: look at all of /proc then."""
    found: list[int] = []
    level = [pid]
    while level:
        below = []
        for parent in level:
            try:
                tasks = os.listdir(f"/proc/{parent}/task")
            except OSError:
                continue  # gone meanwhile
            for tid in tasks:
                try:
                    with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                        below += [int(x) for x in f.read().split()]
                except FileNotFoundError:
                    if parent == pid:
                        return None  # this kernel has no `children` files
                except OSError:
                    continue
        found += below
        if len(found) > MAX_DESCENDANTS:
            return None
        level = below
    return found


def spawn_cwd(env: dict[str, str]) -> str | None:
    """Where the sandbox is spawned from: the engine's `PWD` when it exists on the host.

    The cgroup join prefix is a shell, and a shell resets `PWD` to its own
    directory unless they agree; OpenCode takes its project from `PWD`.
    """
    pwd = env.get("PWD")
    return pwd if pwd and os.path.isdir(pwd) else None


def engine_channel() -> tuple[socket.socket, socket.socket]:
    """The engine's stdout: (our end, its end) of a Unix socket pair, not a pipe.

    Every process of the run can open `/proc/<engine>/fd/1` (same uid, same
    sandbox); for a pipe that gives a second writer, and a tool could forge
    the engine's events and cost (issue 12). A socket cannot be opened
    through `/proc` (ENXIO), so only what inherits the descriptor writes
    here: the engine, and the children it hands its own stdout to.
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.shutdown(socket.SHUT_WR)  # nothing goes back to the engine this way
    theirs.shutdown(socket.SHUT_RD)
    return ours, theirs


def _tail_text(data: bytes) -> str:
    # Cutting the front may leave half a UTF-8 sequence: skip its continuation bytes.
    start = 0
    while start < min(3, len(data)) and 0x80 <= data[start] <= 0xBF:
        start += 1
    return data[start:].decode("utf-8", "replace")


# OpenCode's log lines (`--print-logs`) that say how its model requests go: a request
# starts (`message=stream`), or fails and may be retried (`message="stream error"`). A
# cold run prints nothing on stdout while OpenCode waits out a provider's Retry-After,
# so these are passed on as `log` frames (bounded) for the Computer to see it waiting.
_MODEL_LOG = re.compile(rb'level=\w+ .*\bmessage=(?:stream|"stream error") ')
MAX_LOG_FRAMES = 200
MAX_LOG_LINE = 2048


def log_frame(line: bytes | bytearray) -> bytes:
    """One NDJSON `log` frame: an OpenCode log line about a model request (cut to 2 KiB)."""
    text = bytes(line[:MAX_LOG_LINE]).decode("utf-8", "replace")
    return orjson.dumps({"t": "log", "line": text}) + b"\n"


def line_frame(line: bytes | bytearray) -> bytes:
    """One NDJSON `line` frame. Invalid UTF-8 becomes U+FFFD (JSON carries text only)."""
    return orjson.dumps({"t": "line", "data": line.decode("utf-8", "replace")}) + b"\n"


class EngineRun:
    """A started-or-to-start engine process and what the launcher knows about it."""

    def __init__(
        self,
        run_id: str,
        agent_id: str,
        argv: list[str],
        env: dict[str, str],
        stdin: bytes,
        stdout_limit: int,
        limits: TurnLimits | None = None,
        cgroup: RunCgroup | None = None,
        network: SandboxNetwork | None = None,
        disk_dirs: tuple[Path, ...] = (),
    ) -> None:
        self.run_id = run_id
        self.agent_id = agent_id
        self.argv = argv
        self.env = env
        self.stdin = stdin
        self.stdout_limit = stdout_limit
        self.limits = limits  # None: not watched (tests of the process rules)
        self.cgroup = cgroup
        self.network = network  # its own network namespace (Linux), attached before it starts
        self.disk_dirs = disk_dirs  # the agent's directories: their size is watched
        self.started_at = datetime.now(UTC).isoformat(timespec="milliseconds")
        self.pid: int | None = None
        self.bytes_out = 0
        self.reason: StopReason | None = None
        self.client_gone = False
        self._stop = anyio.Event()
        self._leader_done = anyio.Event()
        self._stdout_done = anyio.Event()
        self._stderr = bytearray()
        self._emit: Emit | None = None

    def info(self) -> RunInfo:
        """A row of `GET /runs`."""
        return RunInfo(
            run_id=self.run_id,
            agent_id=self.agent_id,
            pid=self.pid,
            started_at=self.started_at,
            bytes_out=self.bytes_out,
        )

    def request_stop(self, reason: StopReason = "stopped") -> None:
        """Ask for a graceful stop (SIGINT, SIGKILL after 2 s). Idempotent."""
        if self.reason is None:
            self.reason = reason
        self._stop.set()

    async def execute(self, emit: Emit) -> ExitFrame:
        """Run to the end, sending frames through `emit`; returns the exit frame.

        Cancellation from outside (server shutdown) still stops the group:
        the clean-up runs shielded.
        """
        self._emit = emit
        network = self.network
        ours, theirs = engine_channel()
        try:
            process = await anyio.open_process(
                network.argv(self.argv) if network else self.argv,
                cwd=spawn_cwd(self.env),
                stdin=subprocess.PIPE,
                stdout=theirs.fileno(),
                stderr=subprocess.PIPE,
                env=self.env,
                start_new_session=True,
                pass_fds=network.pass_fds if network else (),
            )
        except BaseException:
            ours.close()
            if self.cgroup is not None:
                self.cgroup.remove()
            if network:
                network.close()
            raise
        finally:
            theirs.close()
        stdout = await SocketStream.from_socket(ours)
        self.pid = process.pid
        log.info("run %s of agent %s started (pid %d)", self.run_id, self.agent_id, process.pid)
        try:
            if network:
                await self._attach_network(network, process)
            started: dict[str, object] = {"t": "started", "pid": process.pid}
            if network and network.plan.publish:
                started["published_port"] = network.plan.publish[1]
            await self._send(orjson.dumps(started) + b"\n")
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._feed_stdin, process)
                tg.start_soon(self._collect_stderr, process)
                tg.start_soon(self._pump_stdout, stdout, process.pid)
                tg.start_soon(self._stop_when_asked, process.pid)
                if network:
                    tg.start_soon(self._report_denials, network)
                watch = self._watch(process.pid)
                if watch is not None:
                    tg.start_soon(self._end_at_limit, watch, process.pid)
                await process.wait()
                self._leader_done.set()
                if watch is not None and self.reason is None:
                    # An OOM kill can end the engine before the watch looked.
                    self._limit_hit(watch.hit(), process.pid)
                await self._clean_up_group(process.pid)
                with anyio.move_on_after(DRAIN_GRACE_S):
                    await self._stdout_done.wait()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._ensure_dead(process, stdout)
                if network:
                    await self._send_denials(network)  # before the exit frame: the last ones
                    network.close()
        code = process.returncode
        assert code is not None  # the process has been waited for
        log.info(
            "run %s ended: status %s, %d bytes out, reason %s",
            self.run_id,
            code,
            self.bytes_out,
            self.reason,
        )
        return ExitFrame(
            t="exit",
            code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            stderr_tail=_tail_text(bytes(self._stderr)),
            reason=self.reason,
        )

    async def _attach_network(self, network: SandboxNetwork, process: Process) -> None:
        """Network the sandbox before its engine starts; a sandbox without one never runs.

        When it does not start, the error carries how bwrap ended and what it wrote.
        """
        network.spawned()
        try:
            await network.attach()
        except NetworkUnavailable as exc:
            if isinstance(exc, SandboxExited):
                # bwrap ends by itself once its sandbox has: its own status is the telling one.
                with anyio.move_on_after(EXIT_GRACE_S):
                    await process.wait()
            # bwrap ignores SIGINT and waits on its block fd: no graceful stop to wait for.
            _signal_group(process.pid, signal.SIGKILL)
            await process.wait()
            stderr = b""
            with anyio.move_on_after(DRAIN_GRACE_S):
                stderr = await _read_to_end(process.stderr)
            raise NetworkUnavailable(sandbox_failure(str(exc), process.returncode, stderr)) from exc

    async def _report_denials(self, network: SandboxNetwork) -> None:
        """While the run goes on: what its firewall refused, every `DENIAL_POLL_S`."""
        while True:
            await anyio.sleep(DENIAL_POLL_S)
            await self._send_denials(network)

    async def _send_denials(self, network: SandboxNetwork) -> None:
        denials = await anyio.to_thread.run_sync(network.denials)
        if denials:
            frames = (orjson.dumps({"t": "denied", **d.as_json()}) + b"\n" for d in denials)
            await self._send(b"".join(frames))

    async def _send(self, data: bytes) -> None:
        if self.client_gone or self._emit is None:
            return
        try:
            await self._emit(data)
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            # Nobody is listening any more: no orphan engines (launcher.md).
            log.info("client of run %s went away (%s); stopping it", self.run_id, exc)
            self.client_gone = True
            self.request_stop()

    async def _feed_stdin(self, process: Process) -> None:
        stream = process.stdin
        assert stream is not None
        try:
            if self.stdin:
                await stream.send(self.stdin)
        except (anyio.BrokenResourceError, OSError) as exc:
            log.info("run %s did not read all of its stdin: %s", self.run_id, exc)
        finally:
            await stream.aclose()

    async def _collect_stderr(self, process: Process) -> None:
        stream = process.stderr
        assert stream is not None
        partial = bytearray()
        sent = 0
        async for chunk in _ChunkIter(stream):
            self._stderr += chunk
            if len(self._stderr) > STDERR_TAIL:
                del self._stderr[: len(self._stderr) - STDERR_TAIL]
            if sent >= MAX_LOG_FRAMES:
                continue
            partial += chunk
            *lines, rest = bytes(partial).split(b"\n")
            partial = bytearray(rest[-MAX_LOG_LINE:])
            for line in lines:
                if sent < MAX_LOG_FRAMES and _MODEL_LOG.search(line[:MAX_LOG_LINE]):
                    sent += 1
                    await self._send(log_frame(line))

    async def _pump_stdout(self, stream: ByteReceiveStream, pgid: int) -> None:
        pending = bytearray()
        try:
            async for chunk in _ChunkIter(stream):
                room = self.stdout_limit - self.bytes_out
                self.bytes_out += len(chunk)
                if room <= 0:
                    continue  # over the cap: drain and drop until the group is gone
                if len(chunk) > room:
                    chunk = chunk[:room]
                    self._over_limit(pgid)
                pending += chunk
                if b"\n" not in chunk:
                    continue  # a long line still arriving: do not rescan what we have
                *lines, rest = pending.split(b"\n")
                pending = bytearray(rest)
                if lines:
                    await self._send(b"".join(line_frame(line) for line in lines))
            if pending and self.bytes_out <= self.stdout_limit:
                await self._send(line_frame(bytes(pending)))  # a last line without "\n"
        finally:
            self._stdout_done.set()

    def _over_limit(self, pgid: int) -> None:
        log.warning("run %s wrote over %d bytes; killing it", self.run_id, self.stdout_limit)
        if self.reason is None:
            self.reason = "output_too_large"
        _signal_group(pgid, signal.SIGKILL)

    def _watch(self, leader: int) -> ResourceWatch | None:
        if self.limits is None:
            return None
        return ResourceWatch(self.limits, self.cgroup, leader, disk_dirs=self.disk_dirs)

    async def _end_at_limit(self, watch: ResourceWatch, pgid: int) -> None:
        """End the run once it hits a resource limit (a fork bomb spins at the cap otherwise)."""
        while not self._leader_done.is_set():
            if self._limit_hit(await anyio.to_thread.run_sync(watch.hit), pgid):
                return
            await anyio.sleep(WATCH_INTERVAL_S)

    def _limit_hit(self, hit: LimitHit | None, pgid: int) -> bool:
        if hit is None:
            return False
        log.warning("run %s hit a resource limit (%s); killing it", self.run_id, hit)
        if self.reason is None:
            self.reason = hit
        # The group holds bwrap: its death takes the whole pid namespace with it.
        _signal_group(pgid, signal.SIGKILL)
        return True

    async def _stop_when_asked(self, pgid: int) -> None:
        await self._stop.wait()
        if self._leader_done.is_set():
            return
        _signal_group(pgid, signal.SIGINT)
        with anyio.move_on_after(STOP_GRACE_S):
            await self._leader_done.wait()
            return
        log.info("run %s ignored SIGINT for %.0f s; killing it", self.run_id, STOP_GRACE_S)
        _signal_group(pgid, signal.SIGKILL)

    async def _clean_up_group(self, pgid: int) -> None:
        """After the leader exited: SIGTERM what is left of the group, SIGKILL after 2 s."""
        if not _signal_group(pgid, signal.SIGTERM):
            return
        pause = 0.001  # bwrap's own helper usually lingers a moment: look again soon
        with anyio.move_on_after(CLEANUP_GRACE_S):
            while group_alive(pgid):
                await anyio.sleep(pause)
                pause = min(pause * 2, GROUP_POLL_S)
            return
        _signal_group(pgid, signal.SIGKILL)

    async def _ensure_dead(self, process: Process, stdout: SocketStream) -> None:
        if process.returncode is None:
            # Cancelled from outside while running: stop it the normal way.
            _signal_group(process.pid, signal.SIGINT)
            with anyio.move_on_after(STOP_GRACE_S):
                await process.wait()
            if process.returncode is None:
                _signal_group(process.pid, signal.SIGKILL)
                await process.wait()
            await self._clean_up_group(process.pid)
        if self.cgroup is not None:
            await anyio.to_thread.run_sync(self.cgroup.remove)
        await stdout.aclose()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                await stream.aclose()


async def _read_to_end(stream: ByteReceiveStream | None) -> bytes:
    """What is left in `stream` (its last `STDERR_TAIL` bytes) once its writers are gone."""
    data = bytearray()
    if stream is not None:
        async for chunk in _ChunkIter(stream):
            data += chunk
            del data[:-STDERR_TAIL]
    return bytes(data)


class _ChunkIter:
    def __init__(self, stream: ByteReceiveStream) -> None:
        self._stream = stream

    def __aiter__(self) -> _ChunkIter:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._stream.receive(READ_CHUNK)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise StopAsyncIteration from None
