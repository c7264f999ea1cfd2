"""`crew-launcher sandbox`: run one command under exactly the policy an agent gets.

Like `codex sandbox`: handy to see what an agent can and cannot do, and to
debug a tool that misbehaves in the sandbox. `HOME` and `CREW_HOME` come from
the environment; the self-test must pass first (never run unsandboxed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from crew_common.egress import EgressPolicy
from sandbox_launcher.backend import open_backend
from sandbox_launcher.bwrap import LinuxMode
from sandbox_launcher.engine_run import become_subreaper, group_alive
from sandbox_launcher.git_guard import baseline, guarded_git_dirs, restore
from sandbox_launcher.limits import DEFAULT_MAX_CONNECTIONS
from sandbox_launcher.network import (
    PUBLIC,
    NetworkPlan,
    NetworkUnavailable,
    SandboxNetwork,
)
from sandbox_launcher.ownership import HandOverFailed, hand_over
from sandbox_launcher.paths import PathRefused, resolved_dir
from sandbox_launcher.policy import SandboxPolicy, check_read_dir
from sandbox_launcher.selftest import self_test
from sandbox_launcher.tool_shell import tool_shell_base
from sandbox_launcher.toolchains import toolchain_roots

CLEANUP_GRACE_S = 2.0


def crew_home_from_env() -> Path:
    """`$CREW_HOME`, else `~/.crew` (architecture.md)."""
    return Path(os.environ.get("CREW_HOME") or os.path.expanduser("~/.crew"))


def interpreter_dirs() -> list[str]:
    """The directories this Python needs (prefix, base prefix): so `crew` works inside."""
    dirs = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    return sorted(dirs)


def command_policy(
    agent_dir: str, runtime_dir: str, read_dirs: list[str], home: Path, crew_home: Path
) -> SandboxPolicy:
    """The policy for `sandbox`: the given dirs resolved, `<runtime>/tmp` created."""
    agent = resolved_dir(os.path.realpath(agent_dir), "--agent-dir")
    runtime = resolved_dir(os.path.realpath(runtime_dir), "--runtime-dir")
    tmp = runtime / "tmp"
    tmp.mkdir(mode=0o700, exist_ok=True)
    resolved_dir(str(tmp), "the runtime temp dir")
    (crew_home / "sockets").mkdir(mode=0o700, parents=True, exist_ok=True)
    work = agent / "work" if (agent / "work").is_dir() else agent
    reads = [check_read_dir(os.path.realpath(d), home, crew_home) for d in read_dirs]
    return SandboxPolicy(
        home=home,
        crew_home=crew_home,
        agent_dir=agent,
        runtime_dir=runtime,
        tmp_dir=tmp,
        work_dir=work,
        read_dirs=tuple(dict.fromkeys(reads)),
        guarded_git=guarded_git_dirs(work),
    )


def agent_env(policy: SandboxPolicy) -> dict[str, str]:
    """An agent-like environment: nothing inherited but PATH, LANG and TERM."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(policy.agent_dir),
        "TMPDIR": str(policy.tmp_dir),
        "TMPPREFIX": f"{policy.tmp_dir}/zsh",
        "PWD": str(policy.work_dir),
    }
    for key in ("LANG", "TERM"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def run_sandboxed(
    mode: LinuxMode | None,
    agent_dir: str,
    runtime_dir: str,
    read_dirs: list[str],
    command: list[str],
    loopback_ports: list[int] | None = None,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    egress: EgressPolicy = PUBLIC,
) -> int:
    """Run `command` sandboxed; its exit status (128+N when killed by signal N).

    `loopback_ports`: host-loopback TCP ports reachable inside (Linux), as a run's;
    `max_connections`: the TCP connections it may hold at a time (Linux); `egress`:
    where it may connect (Linux). What the firewall refused is written to stderr at
    the end, one `egress denied: {json}` line per address, port and protocol.
    """
    loopback_ports = loopback_ports or []
    if not command:
        sys.stderr.write("crew-launcher sandbox: no command given after --\n")
        return 2
    home = Path(os.path.realpath(os.path.expanduser("~")))
    crew_home = Path(os.path.realpath(crew_home_from_env()))
    # The toolchains on PATH, as every agent gets them (refusals are logged).
    tools = toolchain_roots(os.environ.get("PATH", ""), home, crew_home, os.environ)
    toolchain_dirs = [str(d) for d in tools.dirs]
    try:
        policy = command_policy(
            agent_dir,
            runtime_dir,
            [*interpreter_dirs(), *toolchain_dirs, *read_dirs],
            home,
            crew_home,
        )
    except (PathRefused, OSError) as exc:
        sys.stderr.write(f"crew-launcher sandbox: {exc}\n")
        return 2
    backend, health = open_backend(mode, tool_shell_base=tool_shell_base(crew_home))
    reason = health.reason if backend is None else self_test(backend, home, crew_home)
    if backend is None or reason is not None:
        sys.stderr.write(f"crew-launcher sandbox: sandbox unavailable: {reason}\n")
        return 125
    become_subreaper()
    if backend.engine_ids is not None:  # as root: the engine user's, as a run's (issue 20)
        try:
            hand_over(policy, backend.engine_ids)
        except HandOverFailed as exc:
            sys.stderr.write(f"crew-launcher sandbox: {exc}\n")
            return 2
    refusal = backend.egress_refusal(egress)
    if refusal is not None:
        sys.stderr.write(f"crew-launcher sandbox: {refusal}\n")
        return 125
    plan = NetworkPlan(tuple(loopback_ports), None, max_connections, egress)
    network = backend.network(plan)
    argv = backend.argv(policy, command, plan)
    repos = baseline(policy.work_dir)  # what it plants in git hooks and config is undone
    process = subprocess.Popen(
        network.argv(argv) if network else argv,
        env=agent_env(policy),
        start_new_session=True,
        pass_fds=network.pass_fds if network else (),
    )
    try:
        if network:
            network.spawned()
            network.attach_blocking()
        return _wait(process)
    except NetworkUnavailable as exc:
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()
        sys.stderr.write(f"crew-launcher sandbox: {exc}\n")
        return 125
    finally:
        if network:
            _report_denials(network)
            network.close()
        restore(repos)


def _report_denials(network: SandboxNetwork) -> None:
    for denial in network.denials():
        sys.stderr.write(f"crew-launcher sandbox: egress denied: {json.dumps(denial.as_json())}\n")


def _wait(process: subprocess.Popen[bytes]) -> int:
    """Wait for the sandboxed command, passing signals on; then clean up its group."""

    def forward(sig: int, frame: FrameType | None) -> None:
        # The child has its own session: pass the user's Ctrl+C / kill on to it.
        _signal_group(process.pid, sig)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    code = process.wait()
    if _signal_group(process.pid, signal.SIGTERM):
        deadline = time.monotonic() + CLEANUP_GRACE_S
        while group_alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_group(process.pid, signal.SIGKILL)
    return code if code >= 0 else 128 - code


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True
