"""The launcher's state: its configuration, the backend, and the runs in flight.

`Launcher.prepare` turns a typed `RunRequest` into an `EngineRun` (argv,
environment, stdin) or refuses it with a reason. The HTTP layer
(`sandbox_launcher.app`) only maps these to responses.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from crew_common.egress import EgressPolicy
from crew_common.launcher_wire import (
    EngineHealth,
    Health,
    RunRequest,
    SandboxHealth,
    ServerInfo,
    ServerRequest,
)
from crew_common.layout import AgentPaths
from sandbox_launcher.backend import Backend
from sandbox_launcher.engine_run import EngineRun
from sandbox_launcher.git_guard import Baseline, baseline, guarded_git_dirs, restore
from sandbox_launcher.limits import CgroupParents, RunCgroup, TurnLimits
from sandbox_launcher.network import NetworkPlan, free_loopback_port
from sandbox_launcher.ownership import HandOverFailed, hand_over, shared_dir_readable
from sandbox_launcher.paths import PathRefused, dir_below, is_inside
from sandbox_launcher.policy import SandboxPolicy, check_read_dir
from sandbox_launcher.warm_server import (
    NAMESPACE_PORT,
    ServerFailed,
    WarmServer,
    WarmServers,
    server_command,
)

log = logging.getLogger(__name__)

DEFAULT_TITLE = "crew turn"
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
VERSION_TIMEOUT_S = 15.0


class RequestRefused(Exception):
    """A run request the launcher will not start; `status` is the HTTP status to answer."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class LauncherConfig:
    """Fixed at start. `crew_home` and `home` are resolved; `run_id` names `runtime/<run-id>/`."""

    crew_home: Path
    home: Path
    run_id: str
    opencode: Path | None
    # Toolchains on PATH and the user's read_only_roots (`toolchains`), checked at start.
    read_roots: tuple[Path, ...] = ()
    rustup_home: Path | None = None


def find_opencode(explicit: str | None) -> Path | None:
    """The opencode executable: `--opencode PATH`, else `PATH`, else `~/.opencode/bin`."""
    candidates = [explicit] if explicit else [shutil.which("opencode")]
    if not explicit:
        candidates.append(os.path.expanduser("~/.opencode/bin/opencode"))
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return Path(os.path.abspath(candidate))
    return None


def engine_read_paths(
    engine: Path, home: Path, crew_home: Path
) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """What must stay readable for the engine executable: (dirs, files).

    An npm install (`…/node_modules/.bin/opencode` → a package inside
    `node_modules`) needs its whole `node_modules` tree; a single binary
    (`~/.opencode/bin/opencode`) needs only itself — Bun reads its own file to
    load the embedded program. A script also needs its interpreter
    (`#!/usr/bin/env node` with node from nvm in `$HOME`): its install prefix
    when that is a safe read root, else the interpreter file alone.
    """
    real = Path(os.path.realpath(engine))
    parts = real.parts
    if "node_modules" in parts:
        dirs: list[Path] = [Path(*parts[: parts.index("node_modules") + 1])]
        files: list[Path] = []
    else:
        dirs, files = [], [real]
    interpreter = _script_interpreter(real)
    if interpreter is not None:
        try:
            dirs.append(check_read_dir(str(interpreter.parent.parent), home, crew_home))
        except PathRefused:
            files.append(interpreter)
    return tuple(dirs), tuple(files)


def _script_interpreter(path: Path) -> Path | None:
    """The resolved interpreter of a `#!` script (through `/usr/bin/env NAME`), or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return None
    program = words[0]
    if os.path.basename(program) == "env":
        names = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        found = shutil.which(names[0]) if names else None
        if found is None:
            return None
        program = found
    return Path(os.path.realpath(program))


def engine_version(opencode: Path) -> str | None:
    """`opencode --version`, or None (logged) when it does not answer."""
    try:
        done = subprocess.run(
            [str(opencode), "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("opencode --version failed: %s", exc)
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        log.warning("opencode --version exited %s: %s", done.returncode, done.stderr.strip()[:200])
        return None
    return lines[-1].strip()


@dataclass
class Launcher:
    """Configuration, the sandbox's health, and the runs in flight (by run id)."""

    config: LauncherConfig
    backend: Backend | None
    sandbox: SandboxHealth
    engine: EngineHealth | None
    runs: dict[str, EngineRun] = field(default_factory=dict)
    # Per run, and per warm server's turn: the work dir's repositories when it started
    # (`git_guard`: what a turn planted in hooks and config is undone after it).
    git_baselines: dict[str, Baseline] = field(default_factory=dict)
    server_git_baselines: dict[str, Baseline] = field(default_factory=dict)
    # The `opencode models` listings in flight: a stop cancels them (server.py).
    listings: set[anyio.CancelScope] = field(default_factory=set)
    limits: TurnLimits = field(default_factory=TurnLimits)
    cgroups: CgroupParents | None = None  # where run cgroups go; None: rlimits only
    servers: WarmServers = field(default_factory=WarmServers)

    def health(self) -> Health:
        """`GET /health`."""
        return Health(sandbox=self.sandbox, engine=self.engine)

    def prepare(self, request: RunRequest) -> EngineRun:
        """Validate a run request and build its engine run; raises `RequestRefused`."""
        backend = self._usable_backend()
        if request.run_id in self.runs:
            raise RequestRefused(409, "run_exists", f"run {request.run_id} is already running")
        busy = [r.run_id for r in self.runs.values() if r.agent_id == request.agent_id]
        if busy:
            raise RequestRefused(
                409,
                "agent_busy",
                f"agent {request.agent_id} already has run {busy[0]}; stop it first",
            )
        try:
            policy = self._policy(request)
        except PathRefused as exc:
            raise RequestRefused(400, "path_refused", str(exc)) from exc
        self._hand_over(backend, policy)
        command = self._command(request, policy)
        env = self._env(request, policy)
        publish = None
        if request.publish_port is not None:
            publish = (request.publish_port, free_loopback_port())
        plan = self._plan(backend, request.loopback_ports, publish, request.egress.policy())
        network = backend.network(plan)
        if network is None and publish is not None:
            raise RequestRefused(
                400, "publish_unsupported", "publish_port needs the sandbox's own network (Linux)"
            )
        self.git_baselines[request.run_id] = baseline(policy.work_dir)
        argv = backend.argv(policy, command, plan)
        cgroup = self._cgroup(request.run_id)
        return EngineRun(
            run_id=request.run_id,
            agent_id=request.agent_id,
            argv=(cgroup.join_prefix() if cgroup else []) + argv,
            env=env,
            stdin=request.stdin.encode("utf-8"),
            stdout_limit=request.stdout_limit,
            limits=self.limits,
            cgroup=cgroup,
            network=network,
            disk_dirs=(policy.agent_dir, policy.runtime_dir),
        )

    def add_run(self, run: EngineRun) -> None:
        """Record a run whose stream begins: `/runs` lists it, `/runs/{id}/stop` finds it."""
        self.runs[run.run_id] = run

    def run_ended(self, run_id: str) -> None:
        """Forget a run that ended; undo what it planted in git hooks and config (`git_guard`)."""
        self.runs.pop(run_id, None)
        before = self.git_baselines.pop(run_id, None)
        if before is not None:
            restore(before)

    def stop_servers(self) -> None:
        """Stop every warm server (launcher shutdown); undo their last turns as a stop does."""
        self.servers.stop_all()
        for agent_id in list(self.server_git_baselines):
            self.server_turn_ended(agent_id, stopped=True)

    def server_turn_ended(self, agent_id: str, stopped: bool) -> None:
        """A warm server's turn ended (swept) or the server stopped: as `run_ended`."""
        before = self.server_git_baselines.pop(agent_id, None)
        if before is None:
            return
        restore(before)
        if not stopped:
            self.server_git_baselines[agent_id] = baseline(before.work_dir)

    def _plan(
        self,
        backend: Backend,
        ports: list[int],
        publish: tuple[int, int] | None,
        egress: EgressPolicy,
    ) -> NetworkPlan:
        """The sandbox's network; refuses a policy this machine cannot enforce (fail closed).

        macOS sandboxes share the host's network: Seatbelt enforces `open` and `none`
        only (README's platform table).
        """
        refusal = backend.egress_refusal(egress)
        if refusal is not None:
            raise RequestRefused(503, "egress_unavailable", refusal)
        return NetworkPlan(tuple(ports), publish, self.limits.max_connections, egress)

    def _cgroup(self, run_id: str) -> RunCgroup | None:
        """The run's own cgroup (process and memory caps), when this machine gives us one."""
        if self.cgroups is None:
            return None
        name = f"crew-{self.config.run_id}-{run_id}"
        try:
            return RunCgroup.create(self.cgroups, name, self.limits)
        except OSError as exc:
            # The rlimits and the watch still hold; say that the memory cap is missing.
            log.warning("no cgroup for run %s (%s): no memory limit for it", run_id, exc)
            return None

    def prepare_server(self, request: ServerRequest) -> WarmServer:
        """Validate a server request and build the agent's warm server (not started yet).

        The same policy and environment as a cold run of that agent; raises `RequestRefused`.
        """
        backend = self._usable_backend()
        if self.servers.get(request.agent_id) is not None:
            raise RequestRefused(
                409, "server_exists", f"agent {request.agent_id} already has a warm server"
            )
        try:
            policy = self._policy(request)
        except PathRefused as exc:
            raise RequestRefused(400, "path_refused", str(exc)) from exc
        self._hand_over(backend, policy)
        assert self.config.opencode is not None
        # In its own network namespace the server's port is reached only through the
        # host port pasta publishes (ours); without one (macOS) the kernel picks a port.
        publish = (NAMESPACE_PORT, free_loopback_port())
        plan = self._plan(backend, request.loopback_ports, publish, request.egress.policy())
        network = backend.network(plan)
        port = NAMESPACE_PORT if network is not None else 0
        command = server_command(os.path.realpath(self.config.opencode), port)
        env = self._env(request, policy)
        # The server and every tool of its turns share one cgroup: the same caps as a run.
        # Its own name per start: a predecessor's cgroup still being removed never
        # leaves the new server without one.
        cgroup = self._cgroup(f"warm-{request.agent_id}-{secrets.token_hex(4)}")
        argv = (cgroup.join_prefix() if cgroup else []) + backend.argv(policy, command, plan)
        self.server_git_baselines[request.agent_id] = baseline(policy.work_dir)
        return WarmServer(
            request.agent_id,
            argv,
            env,
            network,
            cgroup,
            limits=self.limits,
            disk_dirs=(policy.agent_dir, policy.runtime_dir),
        )

    async def start_server(self, request: ServerRequest) -> ServerInfo:
        """Prepare the agent's warm server and start it; raises `RequestRefused`.

        Answers once the server listens; one that does not start is forgotten (502).
        """
        server = self.prepare_server(request)
        self.servers.claim(server)  # before the first await: a second start is refused
        try:
            return await server.start()
        except (ServerFailed, OSError) as exc:
            self.servers.remove(server.agent_id)
            log.warning("warm server of agent %s did not start: %s", server.agent_id, exc)
            raise RequestRefused(
                502, "server_failed", f"the warm server did not start: {exc}"
            ) from exc

    def _hand_over(self, backend: Backend, policy: SandboxPolicy) -> None:
        """A root launcher's engine user gets the agent's directories and the run's `bin/`."""
        ids = backend.engine_ids
        if ids is None:
            return
        try:
            changed = hand_over(policy, ids)
            shared_dir_readable(policy.read_dirs[0])  # bin/ (`_policy` puts it first)
        except (HandOverFailed, OSError) as exc:
            raise RequestRefused(
                500,
                "hand_over_failed",
                f"cannot give agent {policy.agent_dir.name}'s directories to the engine user: "
                f"{exc}; check the crew home's ownership (the Computer runs as root)",
            ) from exc
        if changed:
            log.info("gave %d entries of %s to the engine user", changed, policy.agent_dir.name)

    def _usable_backend(self) -> Backend:
        if self.backend is None or not self.sandbox.ok:
            raise RequestRefused(503, "sandbox_unavailable", self.sandbox.reason or "no sandbox")
        if self.config.opencode is None:
            raise RequestRefused(
                503,
                "engine_missing",
                "opencode was not found when the launcher started; install it or pass --opencode",
            )
        return self.backend

    def _policy(self, request: RunRequest | ServerRequest) -> SandboxPolicy:
        crew, agent_id = self.config.crew_home, request.agent_id
        layout = AgentPaths(crew_home=crew, run_id=self.config.run_id, agent_id=agent_id)
        expected = {
            "agent_dir": layout.agent_dir,
            "runtime_dir": layout.runtime_dir,
            "bin_dir": layout.bin_dir,
        }
        checked: dict[str, Path] = {}
        for name, want in expected.items():
            got = getattr(request, name)
            if got != str(want):
                raise PathRefused(f"{name} must be {want} for agent {agent_id}, got {got!r}")
            checked[name] = dir_below(crew, got, name)
        agent_dir, runtime_dir = checked["agent_dir"], checked["runtime_dir"]
        tmp_dir = dir_below(crew, str(layout.tmp_dir), "the runtime temp dir")
        work_text = request.work_dir_text() or str(layout.work_dir)
        work_dir = dir_below(crew, work_text, "engine_args.dir")
        if not is_inside(work_dir, agent_dir):
            raise PathRefused(f"engine_args.dir must lie inside {agent_dir}, got {work_text!r}")
        read_dirs = [checked["bin_dir"]]
        read_dirs += [check_read_dir(d, self.config.home, crew) for d in request.interpreter_dirs]
        read_dirs += self._read_roots()
        assert self.config.opencode is not None
        engine_dirs, engine_files = engine_read_paths(self.config.opencode, self.config.home, crew)
        return SandboxPolicy(
            home=self.config.home,
            crew_home=crew,
            agent_dir=agent_dir,
            runtime_dir=runtime_dir,
            tmp_dir=tmp_dir,
            work_dir=work_dir,
            read_dirs=tuple(dict.fromkeys([*read_dirs, *engine_dirs])),
            read_files=engine_files,
            guarded_git=guarded_git_dirs(work_dir),
        )

    def _read_roots(self) -> list[Path]:
        """The start's read roots that are still safe (a toolchain may be gone since)."""
        kept = []
        for root in self.config.read_roots:
            try:
                kept.append(check_read_dir(str(root), self.config.home, self.config.crew_home))
            except PathRefused as exc:
                log.warning("not granting %s this run: %s", root, exc)
        return kept

    def _command(self, request: RunRequest, policy: SandboxPolicy) -> list[str]:
        assert self.config.opencode is not None
        engine = os.path.realpath(self.config.opencode)
        title = (request.engine_args.title if request.engine_args else None) or DEFAULT_TITLE
        command = [engine, "run", "--pure", "--format", "json", "--print-logs", "--auto"]
        command += ["--title", title, "--dir", str(policy.work_dir)]
        session = request.effective_session
        if session is not None:
            command += ["--session", session]
        model = request.effective_model
        assert model is not None  # RunRequest guarantees it
        return [*command, "--model", model]

    def _env(self, request: RunRequest | ServerRequest, policy: SandboxPolicy) -> dict[str, str]:
        env = dict(request.env)
        # zsh writes heredocs to $TMPPREFIX (default /tmp/zsh), not $TMPDIR.
        env.setdefault("TMPDIR", str(policy.tmp_dir))
        env.setdefault("TMPPREFIX", f"{env['TMPDIR']}/zsh")
        env.setdefault("PWD", str(policy.work_dir))  # OpenCode takes its project from $PWD
        env.setdefault("PATH", f"{policy.read_dirs[0]}:{DEFAULT_PATH}")
        env.setdefault("HOME", str(policy.agent_dir))
        if self.config.rustup_home is not None:
            # rustup's proxies look in $HOME/.rustup, and HOME is the agent's directory.
            env.setdefault("RUSTUP_HOME", str(self.config.rustup_home))
        return env
