"""The agents' warm servers on this Computer: when to start, keep, evict and give up on them.

One `opencode serve` per agent (started through the launcher, which owns the
process). A server is kept while its agent's turns come; it is stopped

- after `idle_timeout_s` without a turn (10 min by default),
- when a new server needs the room: the servers' resident memory must stay
  under `memory_budget` (a quarter of the RAM by default), so idle servers are
  evicted, least recently used first; a turn that still finds no room runs cold,
- when the turn's environment differs from the one it was started with
  (another model, a new login): a server's config is process-wide,
- when it broke (died, did not answer, was found not to own its port),
- after a turn that left it over `server_ceiling` resident memory (it is
  started afresh for the agent's next turn: OpenCode's memory grows with use).

Three failed starts in a row and the agent runs cold for the rest of this
Computer's life (shown in `/agents`). The counters feed `/metrics`.

A server may also be started before any turn asks for it (`prewarm`, issue 26: a
person opened the agent's room or began typing there, or the Computer just started):
only when it fits the memory budget as it is (a prewarm evicts nothing), and
such a server that no turn used yet is the first to go when a turn needs the room.
A turn that comes while its prewarm is still starting waits for that start.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import httpx
import orjson

from computer_service.engine.capabilities import mcp_states
from computer_service.engine.warm_channel import ServerAddress, server_client
from computer_service.engine.warm_events import server_password
from computer_service.launcher_client import LauncherError
from crew_common.capabilities import Capabilities
from crew_common.launcher_wire import DeniedFrame, ServerInfo, ServerRequest

log = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 10 * 60.0
MAX_FAILED_STARTS = 3
# What one server is expected to grow to (docs/warm-engine.md: ~320 MB idle, ~650 MB after 20 turns).
SERVER_ESTIMATE_BYTES = 650 * 1024 * 1024
MAINTAIN_EVERY_S = 30.0
# A server over this after a turn is restarted (well under a turn's 4 GiB memory cap).
SERVER_CEILING_BYTES = 1536 * 1024 * 1024
# `GET /mcp` after a turn (the agent's MCP servers' state): small, and never worth a wait.
MCP_STATUS_TIMEOUT_S = 2.0
MCP_STATUS_LIMIT = 256 * 1024
# A prewarm's start gives up after this (a turn's own start has the turn's limit).
PREWARM_START_TIMEOUT_S = 120.0


def default_memory_budget() -> int:
    """A quarter of the machine's RAM (bytes); 2 GiB when it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError):
        return 2 * 1024**3


class ServerLauncher(Protocol):
    """What the pool needs of the launcher (`parts.CurrentLauncher` satisfies it)."""

    def generation(self) -> object: ...

    async def start_server(self, request: ServerRequest) -> ServerInfo: ...

    async def sweep_server(self, agent_id: str) -> tuple[int, int | None]: ...

    async def server_limit_hit(self, agent_id: str) -> str | None: ...

    async def server_denials(self, agent_id: str) -> list[DeniedFrame]: ...

    async def stop_server(self, agent_id: str) -> None: ...

    async def servers(self) -> list[ServerInfo]: ...


@dataclass
class AgentServer:
    """One agent's running server, as the Computer sees it."""

    agent_id: str
    address: ServerAddress  # the listener to check: pasta in a network namespace, else the server
    env_key: str
    client: httpx.AsyncClient
    generation: object
    last_used: float = 0.0
    busy: bool = False
    turns: int = 0
    rss_bytes: int | None = None
    server_pid: int = 0  # the `opencode serve` process (host pid)
    prewarmed: bool = False  # started by a prewarm; unused while `turns` is 0

    @property
    def unused_prewarm(self) -> bool:
        """Started ahead of a turn that has not come: the first to evict."""
        return self.prewarmed and self.turns == 0 and not self.busy


@dataclass
class WarmCounters:
    """What `/metrics` shows of the warm engine."""

    warm_turns: int = 0
    cold_turns: int = 0
    starts: int = 0
    failed_starts: int = 0
    evictions: int = 0
    sweeps: int = 0
    swept_processes: int = 0
    ceiling_restarts: int = 0
    prewarms: int = 0
    prewarm_skipped_budget: int = 0
    # How each turn on the warm way found its agent's server (`acquire`).
    turns_found_warm: int = 0
    turns_found_starting: int = 0
    turns_found_none: int = 0

    def lines(self) -> list[str]:
        """Prometheus text lines."""
        rows = [
            ("crew_warm_turns_total", "Turns run on a warm server.", self.warm_turns),
            ("crew_cold_turns_total", "Turns run as one opencode run each.", self.cold_turns),
            ("crew_warm_starts_total", "Warm servers started.", self.starts),
            (
                "crew_warm_failed_starts_total",
                "Warm servers that did not start.",
                self.failed_starts,
            ),
            (
                "crew_warm_evictions_total",
                "Warm servers stopped to make room or when idle.",
                self.evictions,
            ),
            (
                "crew_warm_sweeps_total",
                "Sweeps of a warm server's processes after a turn.",
                self.sweeps,
            ),
            ("crew_warm_swept_processes_total", "Processes a sweep killed.", self.swept_processes),
            (
                "crew_warm_ceiling_restarts_total",
                "Warm servers stopped after a turn left them over the per-server ceiling.",
                self.ceiling_restarts,
            ),
        ]
        rows += [
            ("crew_prewarm_starts_total", "Warm servers started by a prewarm.", self.prewarms),
            (
                "crew_prewarm_skipped_budget_total",
                "Prewarms not started: the server would not fit the memory budget.",
                self.prewarm_skipped_budget,
            ),
        ]
        out = []
        for name, text, value in rows:
            out += [f"# HELP {name} {text}", f"# TYPE {name} counter", f"{name} {value}"]
        name = "crew_warm_turn_server_total"
        out += [
            f"# HELP {name} Turns on the warm way by how they found their agent's server: "
            "warm (running), starting (a prewarm's start was under way), none (started for it).",
            f"# TYPE {name} counter",
            f'{name}{{found="warm"}} {self.turns_found_warm}',
            f'{name}{{found="starting"}} {self.turns_found_starting}',
            f'{name}{{found="none"}} {self.turns_found_none}',
        ]
        return out


def env_directory(env: dict[str, str]) -> str:
    """The agent's work directory: OpenCode's project, as `PWD` names it."""
    return env.get("PWD", "")


def server_key(env: dict[str, str], extra_key: bytes) -> str:
    """What a server serves: the turn's environment and what else it read at start."""
    return env_key({**env, "\0extra": extra_key.hex()})


def env_key(env: dict[str, str]) -> str:
    """A digest of a turn's environment: a server serves only turns with the same one."""
    digest = hashlib.sha256()
    for key in sorted(env):
        digest.update(key.encode() + b"\0" + env[key].encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()


@dataclass
class WarmPool:
    """The warm servers (module doc). Used by the warm way (`warm_run.WarmRun`); the engine's
    `maintain`, `health`, `agent_status` and `metric_lines` are this pool's."""

    launcher: ServerLauncher
    memory_budget: int = field(default_factory=default_memory_budget)
    idle_timeout_s: float = IDLE_TIMEOUT_S
    server_estimate: int = SERVER_ESTIMATE_BYTES
    server_ceiling: int = SERVER_CEILING_BYTES
    clock: Callable[[], float] = anyio.current_time
    servers: dict[str, AgentServer] = field(default_factory=dict)
    failed_starts: dict[str, int] = field(default_factory=dict)
    cold_agents: dict[str, str] = field(default_factory=dict)
    counters: WarmCounters = field(default_factory=WarmCounters)
    # Each agent's MCP servers as its warm server last said (`read_mcp`), for `/agents`.
    mcp: dict[str, list[dict[str, str | None]]] = field(default_factory=dict)
    _starting: dict[str, int] = field(default_factory=dict)
    # Prewarm starts under way: a turn of the agent waits for it instead of a second start.
    _prewarming: dict[str, anyio.Event] = field(default_factory=dict)
    _closed: bool = False

    async def acquire(
        self,
        agent_id: str,
        env: dict[str, str],
        request: Callable[[str], ServerRequest],
        extra_key: bytes = b"",
        start_timeout_s: float | None = None,
    ) -> AgentServer | None:
        """The agent's server for one turn (started if needed), or None: run this turn cold.

        `request(password)` builds the launcher request for a new server; a server
        serves only turns with its environment and `extra_key` (what else it read at start).
        A start that takes longer than `start_timeout_s` (the turn's own limit) is given
        up: a failed start, and the server is stopped.
        """
        if agent_id in self.cold_agents or self._closed:
            return None
        found = "warm"
        if (pending := self._prewarming.get(agent_id)) is not None:
            found = "starting"
            with anyio.move_on_after(start_timeout_s):
                await pending.wait()
        self._forget_other_generations()
        key = server_key(env, extra_key)
        server = self.servers.get(agent_id)
        if server is not None and server.env_key != key:
            log.info("agent %s: its environment changed; restarting its warm server", agent_id)
            await self.discard(server)
            server = None
        if server is None:
            found = "none"
            server = await self._start(agent_id, key, request, start_timeout_s)
        if found == "warm":
            self.counters.turns_found_warm += 1
        elif found == "starting":
            self.counters.turns_found_starting += 1
        else:
            self.counters.turns_found_none += 1
        if server is None:
            return None
        server.busy = True
        return server

    async def prewarm(
        self,
        agent_id: str,
        env: dict[str, str],
        request: Callable[[str], ServerRequest],
        extra_key: bytes = b"",
        warm_up: Callable[[AgentServer], Awaitable[object]] | None = None,
    ) -> str:
        """Start the agent's server ahead of its turn, if it fits (module doc) → what
        happened: `started`, `warm` (it runs already), `starting`, `busy` (a turn has it),
        `budget` (no room without evicting), `cold` (this agent runs cold) or `failed`.
        Never raises for the launcher (a failed start counts as one, as a turn's does).

        `warm_up(server)` runs once the server is up, still as part of the start (a turn
        that comes meanwhile waits for it): what the server's first prompt would boot
        lazily (`warm_run.warm_up`). It must not raise for the server."""
        if agent_id in self.cold_agents or self._closed:
            return "cold"
        if agent_id in self._prewarming or agent_id in self._starting:
            return "starting"
        self._forget_other_generations()
        key = server_key(env, extra_key)
        server = self.servers.get(agent_id)
        if server is not None:
            if server.busy:
                return "busy"
            if server.env_key == key:
                return "warm"
            log.info("agent %s: its environment changed; restarting its warm server", agent_id)
            await self.discard(server)
        await self._refresh_rss()
        if self._used() + self.server_estimate > self.memory_budget:
            self.counters.prewarm_skipped_budget += 1
            log.info("agent %s: no prewarm, its server would not fit the memory budget", agent_id)
            return "budget"
        done = self._prewarming[agent_id] = anyio.Event()
        try:
            server = await self._start(agent_id, key, request, PREWARM_START_TIMEOUT_S)
            if server is not None:
                server.prewarmed = True
                if warm_up is not None:
                    # Busy meanwhile: an idle stop must not take the server mid-warm-up.
                    server.busy = True
                    try:
                        await warm_up(server)
                    finally:
                        server.busy = False
                        server.last_used = self.clock()
        finally:
            del self._prewarming[agent_id]
            done.set()
        if server is None:
            return "failed"
        self.counters.prewarms += 1
        log.info("agent %s: its warm server was started ahead of its turn", agent_id)
        return "started"

    async def release(self, server: AgentServer, *, broken: bool = False) -> None:
        """After a turn: sweep what it left behind, or stop the server when it broke."""
        server.busy = False
        server.last_used = self.clock()
        server.turns += 1
        if broken or self._closed:
            await self.discard(server)
            return
        try:
            killed, rss = await self.launcher.sweep_server(server.agent_id)
        except LauncherError as exc:
            log.warning("agent %s: sweeping its warm server failed: %s", server.agent_id, exc)
            await self.discard(server)
            return
        self.counters.sweeps += 1
        self.counters.swept_processes += killed
        server.rss_bytes = rss if rss is not None else server.rss_bytes
        if server.rss_bytes is not None and server.rss_bytes > self.server_ceiling:
            log.info(
                "agent %s: its warm server grew to %d MiB (ceiling %d MiB); restarting it",
                server.agent_id,
                server.rss_bytes // 2**20,
                self.server_ceiling // 2**20,
            )
            self.counters.ceiling_restarts += 1
            await self.discard(server)

    async def limit_hit(self, server: AgentServer) -> str | None:
        """The resource limit the server's sandbox ran into (the launcher has killed it then).

        None when there was none, or when the launcher cannot say (logged).
        """
        if server.generation is not self.launcher.generation():
            return None  # a replaced launcher took the server with it
        try:
            return await self.launcher.server_limit_hit(server.agent_id)
        except LauncherError as exc:
            log.warning("agent %s: cannot read its warm server's limits: %s", server.agent_id, exc)
            return None

    async def denials(self, server: AgentServer) -> list[DeniedFrame]:
        """What the server's firewall refused since the last call ([] when it cannot say: logged)."""
        if server.generation is not self.launcher.generation():
            return []  # a replaced launcher took the server, and its firewall, with it
        try:
            return await self.launcher.server_denials(server.agent_id)
        except LauncherError as exc:
            log.warning("agent %s: cannot read its warm server's denials: %s", server.agent_id, exc)
            return []

    async def read_mcp(self, server: AgentServer, caps: Capabilities) -> None:
        """After a turn: the state of each of the agent's MCP servers, from its warm
        server's `GET /mcp` (OpenCode 1.18.33); kept for `/agents`. Never raises (logged)."""
        if not caps.mcp_servers:
            self.mcp.pop(server.agent_id, None)
            return
        try:
            with anyio.fail_after(MCP_STATUS_TIMEOUT_S):
                async with server.client.stream("GET", "/mcp") as answer:
                    answer.raise_for_status()
                    body = b""
                    async for chunk in answer.aiter_bytes():
                        body += chunk
                        if len(body) > MCP_STATUS_LIMIT:
                            raise ValueError(f"the answer is over {MCP_STATUS_LIMIT} bytes")
            status = orjson.loads(body)
        except (httpx.HTTPError, ValueError, TimeoutError) as exc:
            log.warning("agent %s: cannot read its MCP servers' state: %s", server.agent_id, exc)
            return
        self.mcp[server.agent_id] = mcp_states(caps, status)

    async def discard(self, server: AgentServer) -> None:
        """Stop the server and forget it (a new one starts at the agent's next turn)."""
        if self.servers.get(server.agent_id) is server:
            del self.servers[server.agent_id]
        with anyio.CancelScope(shield=True):
            await server.client.aclose()
            if server.generation is self.launcher.generation():
                try:
                    await self.launcher.stop_server(server.agent_id)
                except LauncherError as exc:
                    log.warning(
                        "agent %s: stopping its warm server failed: %s", server.agent_id, exc
                    )

    async def _start(
        self,
        agent_id: str,
        key: str,
        request: Callable[[str], ServerRequest],
        timeout_s: float | None = None,
    ) -> AgentServer | None:
        if not await self._make_room(agent_id):
            log.info("agent %s: no memory left for a warm server; this turn runs cold", agent_id)
            return None
        password = server_password()
        generation = self.launcher.generation()
        self._starting[agent_id] = self.server_estimate
        info = None
        try:
            with anyio.move_on_after(timeout_s):
                info = await self.launcher.start_server(request(password))
        except LauncherError as exc:
            self._start_failed(agent_id, str(exc))
            return None
        finally:
            self._starting.pop(agent_id, None)
        if info is None:
            self._start_failed(agent_id, f"not ready within the turn's limit ({timeout_s:g} s)")
            with anyio.CancelScope(shield=True):
                try:  # whatever the launcher got going must not outlive the start
                    await self.launcher.stop_server(agent_id)
                except LauncherError as exc:
                    log.warning("agent %s: stopping its late warm server failed: %s", agent_id, exc)
            return None
        self.counters.starts += 1
        self.failed_starts.pop(agent_id, None)
        address = ServerAddress(info.listener_pid, info.listener_start_time, info.port, password)
        server = AgentServer(
            agent_id=agent_id,
            address=address,
            env_key=key,
            client=server_client(address, env_directory(request(password).env)),
            generation=generation,
            last_used=self.clock(),
            rss_bytes=info.rss_bytes,
            server_pid=info.pid,
        )
        self.servers[agent_id] = server
        return server

    def _start_failed(self, agent_id: str, reason: str) -> None:
        self.counters.failed_starts += 1
        count = self.failed_starts.get(agent_id, 0) + 1
        self.failed_starts[agent_id] = count
        log.warning(
            "agent %s: its warm server did not start (%d in a row): %s", agent_id, count, reason
        )
        if count >= MAX_FAILED_STARTS:
            self.cold_agents[agent_id] = (
                f"the warm server failed to start {count} times in a row ({reason[:300]}); "
                "this agent runs cold until the Computer restarts"
            )

    async def _make_room(self, agent_id: str) -> bool:
        """Evict idle servers, least recently used first, until a new one fits the budget."""
        await self._refresh_rss()
        while self._used() + self.server_estimate > self.memory_budget:
            idle = [s for s in self.servers.values() if not s.busy and s.agent_id != agent_id]
            if not idle:
                return False
            # A prewarm no turn used first, then the least recently used.
            oldest = min(idle, key=lambda s: (not s.unused_prewarm, s.last_used))
            log.info("evicting the warm server of agent %s to make room", oldest.agent_id)
            self.counters.evictions += 1
            await self.discard(oldest)
        return True

    def _used(self) -> int:
        running = sum(s.rss_bytes or self.server_estimate for s in self.servers.values())
        return running + sum(self._starting.values())

    async def _refresh_rss(self) -> None:
        try:
            rows = {row.agent_id: row for row in await self.launcher.servers()}
        except LauncherError as exc:
            log.warning("cannot read the warm servers' memory: %s", exc)
            return
        for server in self.servers.values():
            if (row := rows.get(server.agent_id)) is not None:
                server.rss_bytes = row.rss_bytes

    def _forget_other_generations(self) -> None:
        """A replaced launcher took its servers with it: forget them."""
        current = self.launcher.generation()
        for server in [s for s in self.servers.values() if s.generation is not current]:
            del self.servers[server.agent_id]

    async def stop_idle(self) -> None:
        """Stop the servers idle for longer than the idle timeout."""
        now = self.clock()
        for server in list(self.servers.values()):
            if not server.busy and now - server.last_used >= self.idle_timeout_s:
                log.info("agent %s: its warm server was idle; stopping it", server.agent_id)
                self.counters.evictions += 1
                await self.discard(server)

    async def maintain(self) -> None:
        """For the engine's life: stop idle servers; stop them all at the end."""
        try:
            while True:
                await anyio.sleep(min(MAINTAIN_EVERY_S, self.idle_timeout_s))
                await self.stop_idle()
                await self._refresh_rss()
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop every idle server (shielded: runs while the Computer stops).

        A server in a turn is stopped when its turn releases it: the turn
        ends as cancelled by the runner's stop, not as a crash.
        """
        self._closed = True
        with anyio.CancelScope(shield=True):
            for server in [s for s in self.servers.values() if not s.busy]:
                await self.discard(server)

    def agent_status(self, agent_id: str) -> dict[str, object]:
        """What `/agents` shows of the agent's engine."""
        server = self.servers.get(agent_id)
        idle_s = None if server is None or server.busy else self.clock() - server.last_used
        return {
            "engine_mode": "cold" if agent_id in self.cold_agents else "warm",
            "warm": server is not None,
            "warm_rss_bytes": server.rss_bytes if server else None,
            "warm_idle_s": round(idle_s, 1) if idle_s is not None else None,
            "cold_reason": self.cold_agents.get(agent_id),
            "mcp_servers": self.mcp.get(agent_id),
        }

    def health(self) -> dict[str, object]:
        """What `/health` shows of the warm servers."""
        return {
            "servers": len(self.servers),
            "rss_bytes": sum(s.rss_bytes or 0 for s in self.servers.values()),
            "memory_budget_bytes": self.memory_budget,
            "server_ceiling_bytes": self.server_ceiling,
            "idle_timeout_s": self.idle_timeout_s,
        }
