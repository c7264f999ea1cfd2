"""Sandbox spawn cost: `true` and a warm server's start through the launcher vs bare bwrap.

Run: scripts/bench sandbox [--runs N] [--quick]

Every variant runs once per round, in rotation, so drift on a shared machine
hits all of them alike. Prints the medians (ms) and what the launcher adds
over bare `bwrap --ro-bind / / true`, as the median of the per-round
differences (robust against a neighbour's load coming and going), with an untimed
pause before each (`--pause-ms`, 100: a launcher's runs are a turn apart, and
what it does after one, reaping pasta and starting its spare firewall helper,
is on no run's path). Aims: launcher
path ≤ 15 ms over bare bwrap (quality.md / issue 4), ≤ 40 ms for a cold run and a
warm server's start, both modes (issue 26). `--quick` runs only what that last
line needs (bare bwrap, the argvs with and without their network, the launcher).

- plain:          subprocess.run(["/usr/bin/true"])
- python -I -S:   `python -I -S -c pass`, the floor of any Python helper (hybrid's Landlock step)
- bare bwrap:     bwrap --ro-bind / / true
- argv tmpfs bare: the tmpfs argv without our in-sandbox helper (no seccomp, no rlimits):
                  what tmpfs mode cost before issue 12
- argv tmpfs:     the launcher's full tmpfs argv (helper: rlimits + seccomp), run directly
- argv hybrid:    the launcher's full hybrid argv (helper: rlimits + Landlock + seccomp)
- argv X +net:    the same with the sandbox's own network namespace: bwrap --unshare-net,
                  pasta attached before the command runs, stopped after (issue 12)
- hybrid +net open / allow: `argv hybrid +net` (whose policy is the default, `public`)
                  with egress mode `open` (no egress refusals) and `allow` (two rules, one a
                  host name: the launcher's resolver and its sets too), issue 23
- launcher X:     POST /runs over the launcher's Unix socket until the `exit` frame,
                  with `/usr/bin/true` as the engine (it ignores the opencode arguments);
                  with its network namespace, as every run has
- bare server:    `bwrap --ro-bind / / FAKE serve …` until FAKE's "listening" line, where
                  FAKE is a 3-line sh script that prints OpenCode's line and sleeps
- launcher server X: POST /servers (a launcher whose `--opencode` is FAKE) until its answer
                  (the server listens, its pid is found, its port published by pasta); the
                  stop afterwards is not timed
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crew_common.egress import EgressPolicy
from sandbox_launcher.bwrap import LinuxMode, bwrap_argv, find_tools
from sandbox_launcher.network import (
    OPEN,
    PUBLIC,
    NetworkPlan,
    PastaTools,
    SandboxNetwork,
    find_pasta,
)
from sandbox_launcher.policy import SandboxPolicy

try:  # the launcher's spare firewall helper (issue 26); absent before it, to compare with
    from sandbox_launcher.nft_helper import NftSpare
except ImportError:  # pragma: no cover - an older tree
    NftSpare = None  # type: ignore[assignment,misc]

TRUE = "/usr/bin/true"
# A stand-in for `opencode serve --pure --print-logs --port N …`: OpenCode's line, then idle.
FAKE_SERVER = """#!/bin/sh
echo "opencode server listening on http://127.0.0.1:$5"
exec sleep 600
"""
ALLOW = EgressPolicy.parse({"mode": "allow", "allow": ["example.test:443", "203.0.113.0/24"]})


class Launcher:
    """A real launcher process over a throwaway crew home."""

    def __init__(self, home: Path, mode: str, opencode: str = TRUE) -> None:
        self.crew = home / ".crew"
        self.run_id = uuid.uuid4().hex[:8]
        self.secret = secrets.token_urlsafe(24)
        name = "server" if opencode != TRUE else "run"
        self.socket = self.crew / "sockets" / f"launcher-{mode}-{name}.sock"
        argv = [sys.executable, "-I", "-m", "sandbox_launcher", "serve", "--crew-home"]
        argv += [str(self.crew), "--run-id", self.run_id, "--socket", str(self.socket)]
        argv += ["--mode", mode, "--opencode", opencode]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "HOME": str(home)},
        )
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(f"{self.secret}\n".encode())
        self.proc.stdin.flush()
        if self.proc.stdout.readline() != b"ready\n":
            raise SystemExit(f"launcher ({mode}) did not start")
        self.client = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)),
            base_url="http://launcher",
            headers={"Authorization": f"Bearer {self.secret}"},
        )
        health = self.client.get("/health").json()
        if not health["sandbox"]["ok"]:
            raise SystemExit(f"sandbox unusable: {health['sandbox']['reason']}")

    def body(self, agent: str) -> dict[str, object]:
        runtime = self.crew / "runtime" / self.run_id / "agents" / agent
        return {
            "run_id": uuid.uuid4().hex,
            "agent_id": agent,
            "agent_dir": str(self.crew / "agents" / agent),
            "runtime_dir": str(runtime),
            "bin_dir": str(self.crew / "runtime" / self.run_id / "bin"),
            "model": "bench/true",
            "env": {"PATH": "/usr/bin:/bin", "TMPDIR": str(runtime / "tmp")},
        }

    def prepare(self, agent: str) -> None:
        for path in (
            self.crew / "agents" / agent / "work",
            self.crew / "runtime" / self.run_id / "agents" / agent / "tmp",
            self.crew / "runtime" / self.run_id / "bin",
        ):
            path.mkdir(parents=True, exist_ok=True)

    def run_true(self, agent: str) -> None:
        with self.client.stream("POST", "/runs", json=self.body(agent)) as response:
            frames = [orjson.loads(line) for line in response.iter_lines() if line]
        if response.status_code != 200 or frames[-1].get("code") != 0:
            raise SystemExit(f"launcher run failed: {response.status_code} {frames[-1:]}")

    def start_server(self, agent: str) -> float:
        """POST /servers until its answer (ms); then the server is stopped, untimed."""
        body = self.body(agent)
        for key in ("run_id", "model"):
            body.pop(key)
        env = body["env"]
        assert isinstance(env, dict)
        env["OPENCODE_SERVER_PASSWORD"] = secrets.token_urlsafe(32)
        start = time.perf_counter()
        response = self.client.post("/servers", json=body, timeout=60)
        elapsed = (time.perf_counter() - start) * 1000
        if response.status_code != 200:
            raise SystemExit(
                f"launcher server start failed: {response.status_code} {response.text}"
            )
        stopped = self.client.post(f"/servers/{agent}/stop", timeout=60)
        if stopped.status_code != 200:
            raise SystemExit(f"launcher server stop failed: {stopped.status_code} {stopped.text}")
        return elapsed

    def close(self) -> None:
        self.client.close()
        assert self.proc.stdin
        self.proc.stdin.close()
        self.proc.wait(timeout=20)


def timed(fn: Callable[[], float | None]) -> float:
    """`fn`'s time (ms), or what it measured itself (the part of it that counts)."""
    start = time.perf_counter()
    measured = fn()
    return measured if measured is not None else (time.perf_counter() - start) * 1000


AIM_MS = 40  # issue 26: the launcher path over bare bwrap, cold run and warm server start


def _verdict(ms: float) -> str:
    return "meets" if ms <= AIM_MS else "MISSES"


def bare_server(bwrap: str, fake: str) -> float:
    """FAKE in bare bwrap until its listening line (ms); then killed, untimed."""
    start = time.perf_counter()
    process = subprocess.Popen(
        [bwrap, "--ro-bind", "/", "/", fake, "serve", "--pure", "--print-logs", "--port", "4096"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    elapsed = (time.perf_counter() - start) * 1000
    os.killpg(process.pid, 9)
    process.wait()
    process.stdout.close()
    if b"listening" not in line:
        raise SystemExit(f"the fake server did not start in bare bwrap: {line!r}")
    return elapsed


def without_helper(argv: list[str], python: str) -> list[str]:
    """The argv with our helper (`python -I -S landlock_exec.py … --`) taken out."""
    start = argv.index(python)
    return argv[:start] + argv[argv.index("--", start) + 1 :]


def run_checked(argv: list[str], env: dict[str, str] | None = None) -> None:
    subprocess.run(argv, check=True, env=env, stdin=subprocess.DEVNULL)


_spares: dict[str, object] = {}


def run_networked(
    argv: list[str], env: dict[str, str], pasta: PastaTools, egress: EgressPolicy = PUBLIC
) -> None:
    """`argv` in its own network namespace, as the launcher runs it (its spare helper too)."""
    plan = NetworkPlan(egress=egress)
    if NftSpare is not None and pasta.nftables is not None:
        spare = _spares.setdefault("spare", NftSpare(sys.executable, pasta.nftables))
        network = SandboxNetwork(pasta, plan, None, spare)  # type: ignore[arg-type]
    else:
        network = SandboxNetwork(pasta, plan)
    try:
        process = subprocess.Popen(
            network.argv(argv), env=env, stdin=subprocess.DEVNULL, pass_fds=network.pass_fds
        )
        network.spawned()
        network.attach_blocking()
        if process.wait() != 0:
            raise SystemExit(f"networked run failed: {process.returncode}")
    finally:
        network.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="only the launcher-path variants")
    # A launcher's runs are an engine turn apart: what it does after one (reaping pasta,
    # starting its spare firewall helper) belongs to no run's path, nor to the next variant's.
    parser.add_argument("--pause-ms", type=float, default=100, help="untimed, before each run")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    tools = find_tools()
    pasta = find_pasta()
    if pasta is None:
        raise SystemExit("pasta not found: install passt (scripts/setup does)")
    base = Path(tempfile.mkdtemp(prefix="crew-bench-", dir="/var/tmp"))
    base.chmod(0o755)  # a root launcher's engine user reads FAKE_SERVER
    home = base / "home"
    fake = base / "opencode-fake-server"
    launchers: dict[str, Launcher] = {}
    try:
        home.mkdir()
        fake.write_text(FAKE_SERVER)
        fake.chmod(0o755)
        for mode in ("hybrid", "tmpfs"):
            launchers[mode] = Launcher(home, mode)
            launchers[mode].prepare(f"bench-{mode}")
            launchers[f"server {mode}"] = Launcher(home, mode, str(fake))
            launchers[f"server {mode}"].prepare(f"serve-{mode}")
        crew = home / ".crew"
        agent = crew / "agents" / "direct"
        runtime = crew / "runtime" / "direct" / "agents" / "direct"
        for path in (agent / "work", runtime / "tmp"):
            path.mkdir(parents=True, exist_ok=True)
        policy = SandboxPolicy(
            home=home,
            crew_home=crew,
            agent_dir=agent,
            runtime_dir=runtime,
            tmp_dir=runtime / "tmp",
            work_dir=agent / "work",
            read_files=(Path(TRUE),),
        )
        env = {"PATH": "/usr/bin:/bin"}
        variants: dict[str, Callable[[], float | None]] = {
            "plain true": lambda: run_checked([TRUE]),
            "python -I -S": lambda: run_checked([tools.python, "-I", "-S", "-c", "pass"]),
            "bare bwrap": lambda: run_checked([tools.bwrap, "--ro-bind", "/", "/", TRUE]),
            "argv tmpfs bare": lambda: run_checked(
                without_helper(bwrap_argv(policy, LinuxMode.TMPFS, tools, [TRUE]), tools.python),
                env,
            ),
            "argv tmpfs": lambda: run_checked(
                bwrap_argv(policy, LinuxMode.TMPFS, tools, [TRUE]), env
            ),
            "argv hybrid": lambda: run_checked(
                bwrap_argv(policy, LinuxMode.HYBRID, tools, [TRUE]), env
            ),
            "argv tmpfs +net": lambda: run_networked(
                bwrap_argv(policy, LinuxMode.TMPFS, tools, [TRUE]), env, pasta
            ),
            "argv hybrid +net": lambda: run_networked(
                bwrap_argv(policy, LinuxMode.HYBRID, tools, [TRUE]), env, pasta
            ),
            "hybrid +net open": lambda: run_networked(
                bwrap_argv(policy, LinuxMode.HYBRID, tools, [TRUE]), env, pasta, OPEN
            ),
            "hybrid +net allow": lambda: run_networked(
                bwrap_argv(policy, LinuxMode.HYBRID, tools, [TRUE]), env, pasta, ALLOW
            ),
            "launcher tmpfs": lambda: launchers["tmpfs"].run_true("bench-tmpfs"),
            "launcher hybrid": lambda: launchers["hybrid"].run_true("bench-hybrid"),
            "bare server": lambda: bare_server(tools.bwrap, str(fake)),
            "launcher server tmpfs": lambda: launchers["server tmpfs"].start_server("serve-tmpfs"),
            "launcher server hybrid": lambda: launchers["server hybrid"].start_server(
                "serve-hybrid"
            ),
        }
        if args.quick:
            quick = {
                "bare bwrap",
                "argv tmpfs",
                "argv hybrid",
                "argv tmpfs +net",
                "argv hybrid +net",
                "launcher tmpfs",
                "launcher hybrid",
                "bare server",
                "launcher server tmpfs",
                "launcher server hybrid",
            }
            variants = {name: fn for name, fn in variants.items() if name in quick}
        for fn in variants.values():  # warm-up
            for _ in range(3):
                fn()
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.runs):
            for name, fn in variants.items():
                time.sleep(args.pause_ms / 1000)
                samples[name].append(timed(fn))
    finally:
        for launcher in launchers.values():
            launcher.close()
        shutil.rmtree(base, ignore_errors=True)

    med = {name: statistics.median(values) for name, values in samples.items()}

    def over(name: str, base: str = "bare bwrap") -> float:
        """Median of the per-round differences `name` − `base` (ms)."""
        return statistics.median(a - b for a, b in zip(samples[name], samples[base], strict=True))

    print(f"sandbox spawn, {args.runs} rounds, each variant once per round (ms)")
    print(f"{'variant':<24}{'median':>9}{'p25':>9}{'p90':>9}{'vs bare bwrap':>16}")
    for name, values in samples.items():
        q = statistics.quantiles(values, n=20)
        print(f"{name:<24}{med[name]:>9.2f}{q[4]:>9.2f}{q[17]:>9.2f}{over(name):>+15.2f}")
    print()
    if "argv tmpfs bare" in samples:
        helper = over("argv tmpfs", "argv tmpfs bare")
        landlock = over("argv hybrid", "argv tmpfs")
        print(
            f"the in-sandbox helper (rlimits + seccomp): {helper:+.2f} ms over the bare tmpfs "
            f"argv (python -I -S alone: {med['python -I -S']:.2f} ms); "
            f"Landlock on top (hybrid): {landlock:+.2f} ms"
        )
    for mode in ("tmpfs", "hybrid"):
        on, off = med[f"argv {mode} +net"], med[f"argv {mode}"]
        print(
            f"network namespace ({mode}): {on / off:.2f}× the argv without it, "
            f"{over(f'argv {mode} +net', f'argv {mode}'):+.2f} ms (pasta started, attached, stopped)"
        )
    if pasta.nftables is not None and "hybrid +net open" in samples:
        print(
            "egress policy at sandbox start (hybrid, vs open): "
            f"public {over('argv hybrid +net', 'hybrid +net open'):+.2f} ms, "
            f"allow {over('hybrid +net allow', 'hybrid +net open'):+.2f} ms "
            f"(open {med['hybrid +net open']:.2f}, public {med['argv hybrid +net']:.2f}, "
            f"allow {med['hybrid +net allow']:.2f} ms median)"
        )
    for mode in ("tmpfs", "hybrid"):
        total = over(f"launcher {mode}")
        print(
            f"launcher {mode}: {total:+.2f} ms over bare bwrap; "
            f"of which launcher/HTTP {over(f'launcher {mode}', f'argv {mode} +net'):+.2f} ms, "
            f"network namespace {over(f'argv {mode} +net', f'argv {mode}'):+.2f} ms, "
            f"sandbox policy {over(f'argv {mode}'):+.2f} ms"
        )
    print()
    print(f"launcher path over bare bwrap (median of per-round differences, aim ≤ {AIM_MS} ms):")
    print(f"{'':<8}{'cold run':>12}{'warm server start':>20}")
    for mode in ("tmpfs", "hybrid"):
        cold = over(f"launcher {mode}")
        warm = over(f"launcher server {mode}", "bare server")
        print(f"{mode:<8}{cold:>+10.2f}ms{warm:>+18.2f}ms  {_verdict(cold)}, {_verdict(warm)}")
    if load_before > 0.5:  # the 1-min average before the rounds: neighbours, not this benchmark
        print(
            f"(load average {load_before:.2f} on {os.cpu_count()} CPUs before the rounds: "
            "a busy machine, rerun on a quiet one)"
        )


if __name__ == "__main__":
    main()
