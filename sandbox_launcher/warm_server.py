"""Warm servers: one sandboxed `opencode serve` per agent, kept between turns.

The server runs under exactly the policy, environment and directories of a
cold turn (`Launcher.prepare_server` builds them with the same code), inside
bwrap's own pid namespace (`--unshare-pid`, as every run). Its life cycle:

- start: spawn it in a new session, read its stdout until the line
  `opencode server listening on http://127.0.0.1:N` (a request sent before
  that line can hang forever: the socket accepts ~0.2 s earlier), then find
  the server's host pid: the namespace's pid 2, the process bwrap's init runs.
- sweep (after every turn, and on stop): kill every process in the server's
  pid namespace except bwrap's init, the server and the server's own
  descendants (its `git` snapshot helpers still run after a turn is idle).
  What a tool left behind (`setsid sleep 300 &`, a double fork, a process
  that ignores SIGTERM) has been re-parented to the init by then. The ppid
  chain is walked for each candidate at kill time: a rule computed once
  races with newly spawned helpers. Candidates are stopped (SIGSTOP) before
  they are killed so they cannot fork meanwhile.
- limits: the server and its tools share one cgroup with a cold run's caps;
  a thread looks at it every `WATCH_INTERVAL_S` for the server's whole life,
  as the watch of a cold run does, and the first limit hit kills the server
  (a fork bomb would spin at the cap, an OOM kill leaves a turn half done).
  The hit is kept for `GET /servers/{agent}/limit`: the Computer asks after
  every turn and fails the turn `resource_limit`, as a cold run's.
- stop: SIGTERM to the server, then SIGKILL to the whole group; the outer
  bwrap's death takes the namespace's init and with it every member.

The launcher never sees the server's traffic: the Computer talks to the
port itself after checking that the listening socket belongs to this very
process (pid + start time, reported here).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import anyio

from crew_common.launcher_wire import ServerInfo
from crew_common.procfs import process_start_time
from sandbox_launcher.denials import Denial
from sandbox_launcher.engine_run import EXIT_GRACE_S, engine_channel, reap_group, spawn_cwd
from sandbox_launcher.limits import (
    WATCH_INTERVAL_S,
    LimitHit,
    ResourceWatch,
    RunCgroup,
    TurnLimits,
)
from sandbox_launcher.network import (
    NetworkUnavailable,
    SandboxExited,
    SandboxNetwork,
    sandbox_failure,
)

log = logging.getLogger(__name__)

LISTENING = re.compile(rb"opencode server listening on http://127\.0\.0\.1:(\d{1,5})\b")
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 2.0
STDERR_TAIL = 64 * 1024
STDOUT_LINE_LIMIT = 64 * 1024
SWEEP_ROUNDS = 20
_POLL_S = 0.02


class ServerFailed(Exception):
    """The server did not come up; the message says why (with its stderr tail)."""


# The server's port inside its own network namespace (Linux): nothing else listens there.
NAMESPACE_PORT = 4096


def server_command(engine: str, port: int = 0) -> list[str]:
    """The server's argv inside the sandbox: loopback only; port 0 lets the kernel pick."""
    return [
        engine,
        "serve",
        "--pure",
        "--print-logs",
        "--port",
        str(port),
        "--hostname",
        "127.0.0.1",
    ]


# ---- /proc ----


@dataclass(frozen=True)
class ProcEntry:
    pid: int
    ppid: int
    ns_pids: tuple[int, ...]  # NSpid: the pid in each namespace, outermost first


def proc_entry(pid: int) -> ProcEntry | None:
    """The process's parent and namespace pids, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    ppid, ns_pids = 0, tuple[int, ...]()
    for line in text.splitlines():
        if line.startswith("PPid:"):
            ppid = int(line.split()[1])
        elif line.startswith("NSpid:"):
            ns_pids = tuple(int(x) for x in line.split()[1:])
    return ProcEntry(pid, ppid, ns_pids)


def pid_namespace(pid: int) -> str | None:
    """`pid:[inode]` of the process's pid namespace, or None when it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def rss_bytes(pid: int) -> int | None:
    """The process's resident memory (VmRSS), or None."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _all_pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def find_server_pid(outer_pid: int) -> int | None:
    """The host pid of the process that is pid 2 of the namespace below `outer_pid`.

    Looked for among `outer_pid`'s descendants first (a few reads: the start
    waits for it), then in the whole of /proc (a kernel without `children`).
    """
    found = _pid_two_below(outer_pid)
    return found if found is not None else _scan_for_pid_two(outer_pid)


def _children(pid: int) -> list[int]:
    """`pid`'s children, from every thread's `children` list ([] when it is gone)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            continue
    return found


def _pid_two_below(outer_pid: int, depth: int = 4) -> int | None:
    """Breadth first down from `outer_pid` (bwrap, its init, the server): pid 2 inside."""
    level = [outer_pid]
    for _ in range(depth):
        level = [child for pid in level for child in _children(pid)][:256]
        for pid in level:
            entry = proc_entry(pid)
            if entry is not None and len(entry.ns_pids) >= 2 and entry.ns_pids[-1] == 2:
                return pid
    return None


def _scan_for_pid_two(outer_pid: int) -> int | None:
    for pid in _all_pids():
        entry = proc_entry(pid)
        if entry is None or len(entry.ns_pids) < 2 or entry.ns_pids[-1] != 2:
            continue
        if _descends_from(pid, outer_pid):
            return pid
    return None


def _descends_from(pid: int, ancestor: int) -> bool:
    seen = 0
    while pid > 1 and seen < 4096:
        if pid == ancestor:
            return True
        entry = proc_entry(pid)
        if entry is None:
            return False
        pid, seen = entry.ppid, seen + 1
    return pid == ancestor


def leftovers(server_pid: int, namespace: str) -> list[int]:
    """Members of `namespace` that are neither its init, nor the server, nor the server's."""
    found = []
    for pid in _all_pids():
        if pid == server_pid or pid_namespace(pid) != namespace:
            continue
        entry = proc_entry(pid)
        if entry is None or entry.ns_pids[-1:] == (1,):
            continue
        if not _descends_from(pid, server_pid):
            found.append(pid)
    return found


def _signal(pid: int, sig: int) -> None:
    # Gone meanwhile (or not ours: then not in the namespace either).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def sweep(server_pid: int, namespace: str) -> int:
    """Kill every leftover of the namespace (module doc); how many were killed."""
    killed: set[int] = set()
    for _ in range(SWEEP_ROUNDS):
        found = leftovers(server_pid, namespace)
        if not found:
            break
        for pid in found:
            _signal(pid, signal.SIGSTOP)  # no more forks while we look
        for pid in found:
            # The chain is read again at kill time: a helper forked meanwhile is the server's.
            if not _descends_from(pid, server_pid):
                _signal(pid, signal.SIGKILL)
                killed.add(pid)
            else:
                _signal(pid, signal.SIGCONT)
    return len(killed)


_PR_SET_PDEATHSIG = 1


def _die_with_launcher() -> None:
    """In the child before exec: SIGKILL when the launcher dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# ---- one server ----


@dataclass
class WarmServer:
    """One agent's server process and what the launcher knows about it."""

    agent_id: str
    argv: list[str]
    env: dict[str, str]
    # Its own network namespace, the port published on the host's loopback by pasta.
    network: SandboxNetwork | None = None
    # Its processes' cap and memory limit (as a cold run's), when the machine gives one.
    cgroup: RunCgroup | None = None
    # Watched as a cold run's (None: not watched, tests of the process rules).
    limits: TurnLimits | None = None
    limit_hit: LimitHit | None = None  # the first limit the server's sandbox ran into
    disk_dirs: tuple[Path, ...] = ()  # the agent's directories, watched for its disk limit
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    process: subprocess.Popen[bytes] | None = None
    port: int | None = None
    pid: int | None = None
    pid_start: int | None = None
    namespace: str | None = None
    _stdout: IO[bytes] | None = None
    _stderr: bytearray = field(default_factory=bytearray)
    _listening: threading.Event = field(default_factory=threading.Event)
    _stderr_read: threading.Event = field(default_factory=threading.Event)  # to its end
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _watch: ResourceWatch | None = None
    _watch_lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)

    def info(self) -> ServerInfo:
        assert self.pid is not None and self.port is not None and self.pid_start is not None
        listener, listener_start = self.pid, self.pid_start
        port = self.port
        if self.network is not None:
            assert self.network.plan.publish is not None and self.network.pasta_pid is not None
            port = self.network.plan.publish[1]
            listener = self.network.pasta_pid
            listener_start = process_start_time(listener) or 0
        return ServerInfo(
            agent_id=self.agent_id,
            pid=self.pid,
            start_time=self.pid_start,
            port=port,
            started_at=self.started_at,
            rss_bytes=rss_bytes(self.pid),
            listener_pid=listener,
            listener_start_time=listener_start,
        )

    def stderr_tail(self) -> str:
        with self._lock:
            return bytes(self._stderr[-4096:]).decode("utf-8", "replace")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def start(self, timeout_s: float = START_TIMEOUT_S) -> ServerInfo:
        """Spawn it and wait for its listening line; `ServerFailed` (after a stop) if not."""
        network = self.network
        # Its stdout a socket, as a cold run's: no tool can open it through /proc and
        # write a "listening" line of its own.
        ours, theirs = engine_channel()
        self._stdout = ours.makefile("rb")
        ours.close()  # the file keeps the socket open
        try:
            self.process = subprocess.Popen(
                network.argv(self.argv) if network else self.argv,
                cwd=spawn_cwd(self.env),
                stdin=subprocess.DEVNULL,
                stdout=theirs.fileno(),
                stderr=subprocess.PIPE,
                env=self.env,
                start_new_session=True,
                preexec_fn=_die_with_launcher,  # a server outlives turns, never its launcher
                pass_fds=network.pass_fds if network else (),
            )
        except OSError:
            if network:
                network.close()
            if self.cgroup is not None:
                self.cgroup.remove()
            self._stdout.close()
            raise
        finally:
            theirs.close()
        if self.limits is not None:
            self._watch = ResourceWatch(
                self.limits, self.cgroup, self.process.pid, disk_dirs=self.disk_dirs
            )
        # Threads drain both pipes for the server's whole life: a full pipe would block it.
        # The limit watch runs as long (it ends once the server is gone).
        for target in (self._read_stdout, self._read_stderr, self._watch_limits):
            threading.Thread(target=target, daemon=True, name=f"warm-{self.agent_id}").start()
        try:
            if network:
                network.spawned()
                try:
                    await network.attach()  # the server starts only once its network is up
                except NetworkUnavailable as exc:
                    why = await anyio.to_thread.run_sync(self._why_not_started, exc)
                    raise ServerFailed(f"the server's network: {why}") from exc
            await self._wait_listening(timeout_s)
        except ServerFailed:
            await anyio.to_thread.run_sync(self.stop)
            raise
        log.info(
            "warm server of agent %s listening on port %s (pid %s)",
            self.agent_id,
            self.port,
            self.pid,
        )
        return self.info()

    def _why_not_started(self, exc: NetworkUnavailable) -> str:
        """`exc` with how bwrap ended and what it wrote, when its sandbox ended on its own."""
        assert self.process is not None
        if not isinstance(exc, SandboxExited):
            return str(exc)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(EXIT_GRACE_S)  # bwrap ends by itself once its sandbox has
        self._stderr_read.wait(EXIT_GRACE_S)
        return sandbox_failure(str(exc), self.process.poll(), self.stderr_tail().encode())

    async def _wait_listening(self, timeout_s: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while not self._listening.is_set():
            if self.process.poll() is not None:
                hit = self.check_limits()
                raise ServerFailed(
                    f"opencode serve exited with status {self.process.returncode} before it "
                    + (f"listened, at a resource limit ({hit})" if hit else "listened")
                    + f": {self.stderr_tail()[-1500:].strip()}"
                )
            if time.monotonic() > deadline:
                raise ServerFailed(f"opencode serve did not listen within {timeout_s:.0f} s")
            # Woken by the line itself (not the next poll): the start is on a turn's path.
            await anyio.to_thread.run_sync(self._listening.wait, _POLL_S)
        pid = await anyio.to_thread.run_sync(find_server_pid, self.process.pid)
        if pid is None:
            raise ServerFailed("the server's process could not be found in its namespace")
        self.pid, self.pid_start, self.namespace = pid, process_start_time(pid), pid_namespace(pid)
        if self.pid_start is None or self.namespace is None:
            raise ServerFailed("the server exited right after it listened")

    def _read_stdout(self) -> None:
        stream = self._stdout
        assert stream is not None
        while line := stream.readline(STDOUT_LINE_LIMIT):
            if not self._listening.is_set() and (found := LISTENING.search(line)):
                self.port = int(found.group(1))
                self._listening.set()

    def _read_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        stream = self.process.stderr
        while chunk := os.read(stream.fileno(), 65536):
            with self._lock:
                self._stderr += chunk
                if len(self._stderr) > STDERR_TAIL:
                    del self._stderr[: len(self._stderr) - STDERR_TAIL]
        self._stderr_read.set()

    # ---- resource limits ----

    def denials(self) -> list[Denial]:
        """What its firewall refused since the last call (none without its own network)."""
        return self.network.denials() if self.network is not None else []

    def check_limits(self) -> LimitHit | None:
        """The limit the server's sandbox ran into, if any; at the first hit it is killed.

        As a cold run: the whole sandbox (the server, the turn's tools) ends, and
        the turn that was running fails `resource_limit`. Safe from any thread.
        """
        with self._watch_lock:
            if self.limit_hit is None and self._watch is not None:
                hit = self._watch.hit()
                if hit is not None:
                    self.limit_hit = hit
                    self._kill_at_limit(hit)
            return self.limit_hit

    def _kill_at_limit(self, hit: LimitHit) -> None:
        log.warning(
            "warm server of agent %s hit a resource limit (%s); killing it", self.agent_id, hit
        )
        if not self.alive():
            return  # reaped already: its group id may be another's by now
        assert self.process is not None
        # The group holds bwrap: its death takes the whole pid namespace with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def _watch_limits(self) -> None:
        """Look at the limits until the server is gone or a limit was hit (module doc)."""
        while self.check_limits() is None and self.alive():
            if self._stopping.wait(WATCH_INTERVAL_S):
                return

    def sweep(self) -> int:
        """Kill what the last turn left behind (module doc); the number killed."""
        if self.pid is None or self.namespace is None or not self.alive():
            return 0
        killed = sweep(self.pid, self.namespace)
        if killed:
            log.info("swept %d leftover process(es) of agent %s", killed, self.agent_id)
        return killed

    def stop(self) -> int | None:
        """SIGTERM the server, SIGKILL the group after 2 s; blocking. Its exit status."""
        process = self.process
        if process is None:
            return None
        self._stopping.set()
        # Read before the cgroup goes: an OOM kill the watch has not seen yet still counts.
        self.check_limits()
        if process.poll() is None and self.pid is not None:
            _signal(self.pid, signal.SIGTERM)  # lets it close its database cleanly
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(STOP_GRACE_S)
        # The outer bwrap's death ends the namespace's init, and with it every member.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        code = process.wait()
        reap_group(process.pid)
        if self.network is not None:
            self.network.close()  # pasta, and with it the published port
        if self.cgroup is not None:
            self.cgroup.remove()
        log.info("warm server of agent %s stopped (status %s)", self.agent_id, code)
        return code


class WarmServers:
    """The warm servers of this launcher, one per agent at most."""

    def __init__(self) -> None:
        self._by_agent: dict[str, WarmServer] = {}

    def get(self, agent_id: str) -> WarmServer | None:
        server = self._by_agent.get(agent_id)
        if server is not None and server.process is not None and not server.alive():
            # It died on its own (killed by its agent, crashed): forget it, reap it.
            self._by_agent.pop(agent_id, None)
            server.stop()
            return None
        return server

    def peek(self, agent_id: str) -> WarmServer | None:
        """The agent's server even when it died: a limit kills it, and its hit is still asked."""
        return self._by_agent.get(agent_id)

    def claim(self, server: WarmServer) -> None:
        """Record a server about to start, so that a second start for its agent is refused."""
        self._by_agent[server.agent_id] = server

    def remove(self, agent_id: str) -> WarmServer | None:
        """Forget the agent's server (it is stopping or did not start); it, if there was one."""
        return self._by_agent.pop(agent_id, None)

    def listing(self) -> list[ServerInfo]:
        return [s.info() for s in list(self._by_agent.values()) if s.alive() and s.pid]

    def stop_all(self) -> None:
        """Stop every server (launcher shutdown); blocking."""
        while self._by_agent:
            _, server = self._by_agent.popitem()
            server.stop()
