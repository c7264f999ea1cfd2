"""`scripts/bench tools`: what the tool shell adds to each bash tool call, native vs Python vs none.

Run: scripts/bench tools [--calls N] [--rounds R]   (defaults 50 calls, 7 rounds)

A warm turn with a fake engine: one engine process, started once in the
launcher's real sandbox (its bwrap argv and in-sandbox helper: rlimits,
seccomp, Landlock in hybrid), runs N trivial bash tool calls one after the
other as OpenCode 1.18 does — `$SHELL -c COMMAND` when `$SHELL` is set, else
`bash -c COMMAND` — and times each from spawn to exit. Not the real OpenCode:
its own cost per call (Bun's spawn, the tool's bookkeeping, the model) is the
same with and without a tool shell, so it would only add noise to the
difference measured here. The sandbox has no network namespace of its own
(the tool shell does not touch the network; `scripts/bench sandbox` measures
pasta).

Three sandboxes per Linux mode, the same but for `$SHELL`:
- no tool shell:     `bash -c` directly (what OpenCode runs without `$SHELL`;
                     a tool could then reach its engine through /proc)
- python tool shell: the fallback (`#!/bin/sh` → `python -I -S landlock_exec.py
                     --tool-shell MODE`, then bash)
- native tool shell: `#!crew-tool-shell --tool-shell=MODE` (scripts/setup builds it),
                     then bash

Every variant runs once per round, in rotation (drift on a shared machine hits
all alike). Prints the median per call of each, and what each tool shell adds
over none as the median of the per-round differences. Then the same paired
call by call: one sandbox (the native one, the Python shells made readable in
it too) whose engine runs each call through all three in turn, so a
neighbour's load hits the three alike; what each adds is the median of the
per-call differences. Aim (issue 26): the native tool shell ≤ 3 ms per call
over none.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sandbox_launcher.bwrap import BwrapTools, LinuxMode, bwrap_argv, find_tools  # noqa: E402
from sandbox_launcher.policy import SandboxPolicy  # noqa: E402
from sandbox_launcher.tool_shell import (  # noqa: E402
    native_tool_shell,
    tool_shell_path,
    write_tool_shells,
)

# The fake engine: N tool calls as OpenCode makes them, each timed spawn → exit. With
# shells given (the paired run), each call runs once through each, in rotating order.
ENGINE = r"""
import json, os, subprocess, sys, time

calls, command = int(sys.argv[1]), sys.argv[2]
shells = json.loads(sys.argv[3]) if len(sys.argv) > 3 else [os.environ.get("SHELL") or "bash"]
times = {shell: [] for shell in shells}
for i in range(calls):
    for shell in shells[i % len(shells):] + shells[: i % len(shells)]:
        start = time.perf_counter()
        done = subprocess.run([shell, "-c", command], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        times[shell].append((time.perf_counter() - start) * 1000)
        if done.returncode != 0 or done.stdout != b"ok\n":
            print(json.dumps({"error": [shell, done.returncode, done.stderr.decode()[-300:]]}))
            sys.exit(1)
print(json.dumps({"ms": times}))
"""
COMMAND = "echo ok"
VARIANTS = ("no tool shell", "python tool shell", "native tool shell")


def sandbox_argv(
    policy: SandboxPolicy,
    mode: LinuxMode,
    tools: BwrapTools,
    engine: Path,
    calls: int,
    shells: list[str] | None = None,
) -> list[str]:
    command = [tools.python, "-I", str(engine), str(calls), COMMAND]
    if shells is not None:
        command.append(orjson.dumps(shells).decode())
    return bwrap_argv(policy, mode, tools, command)


def run_engine(argv: list[str]) -> dict[str, list[float]]:
    """Each shell's call times (ms) from one fake engine run."""
    done = subprocess.run(
        argv,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    try:
        result = orjson.loads(done.stdout.splitlines()[-1])
    except (IndexError, orjson.JSONDecodeError):
        raise SystemExit(
            f"the engine failed ({done.returncode}): {done.stderr.decode()[-500:]}"
        ) from None
    if "error" in result:
        raise SystemExit(f"a tool call failed: {result['error']}")
    return {shell: [float(t) for t in ms] for shell, ms in result["ms"].items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    native = native_tool_shell()
    if native is None:
        raise SystemExit("the native tool shell is not built: run scripts/setup (needs gcc)")
    load_before = os.getloadavg()[0]
    tools = find_tools()
    base = Path(tempfile.mkdtemp(prefix="crew-bench-tools-", dir="/var/tmp"))
    try:
        home = base / "home"
        crew = home / ".crew"
        agent = crew / "agents" / "bench"
        runtime = crew / "runtime" / "bench" / "agents" / "bench"
        for path in (agent / "work", runtime / "tmp", crew / "sockets"):
            path.mkdir(parents=True, exist_ok=True)
        engine = agent / "engine.py"
        engine.write_text(ENGINE)
        shells_base = crew / "tool-shell"
        shells_base.mkdir()
        policy = SandboxPolicy(
            home=home,
            crew_home=crew,
            agent_dir=agent,
            runtime_dir=runtime,
            tmp_dir=runtime / "tmp",
            work_dir=agent / "work",
        )
        with_python = write_tool_shells(shells_base, tools.python, tools.helper, native=None)
        with_native = write_tool_shells(shells_base, tools.python, tools.helper, native=native)
        per_variant = {
            "no tool shell": tools,
            "python tool shell": _with_shells(tools, with_python),
            "native tool shell": _with_shells(tools, with_native),
        }
        print(
            f"{args.calls} bash tool calls (`$SHELL -c '{COMMAND}'`) in one warm fake engine, "
            f"{args.rounds} rounds; load average {load_before:.2f}"
        )
        for mode in LinuxMode:
            # Separate sandboxes, one per variant, rotated per round.
            argvs = {
                name: sandbox_argv(policy, mode, t, engine, args.calls)
                for name, t in per_variant.items()
            }
            for argv in argvs.values():
                run_engine(argv)  # warm-up: page cache, the shells' first exec
            medians: dict[str, list[float]] = {name: [] for name in VARIANTS}
            for round_ in range(args.rounds):
                order = VARIANTS[round_ % 3 :] + VARIANTS[: round_ % 3]
                for name in order:
                    [times] = run_engine(argvs[name]).values()
                    medians[name].append(statistics.median(times))
            report(f"{mode.value}, one sandbox per variant", medians)
            # Paired: one sandbox, each call through all three in turn (drift cancels).
            both = dataclasses.replace(
                per_variant["native tool shell"],
                support_dirs=(*tools.support_dirs, with_python),
            )
            shells = [
                "bash",
                str(tool_shell_path(with_python, mode.value)),
                str(tool_shell_path(with_native, mode.value)),
            ]
            argv = sandbox_argv(policy, mode, both, engine, args.calls, shells)
            run_engine(argv)
            paired: dict[str, list[float]] = {name: [] for name in VARIANTS}
            for _ in range(args.rounds):
                for name, times in zip(VARIANTS, run_engine(argv).values(), strict=True):
                    paired[name] += times
            report(f"{mode.value}, paired in one sandbox (per call)", paired)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _with_shells(tools: BwrapTools, shells: Path) -> BwrapTools:
    return dataclasses.replace(tools, tool_shells=shells)


def report(title: str, samples: dict[str, list[float]]) -> None:
    """Each variant's median, and each tool shell over none: the median of the paired
    differences (round by round, or call by call)."""
    bare = samples["no tool shell"]
    print(f"{title}:")
    over: dict[str, float] = {}
    for name in VARIANTS:
        line = f"  {name:<18} {statistics.median(samples[name]):7.2f} ms per call"
        if name != "no tool shell":
            over[name] = statistics.median(a - b for a, b in zip(samples[name], bare, strict=True))
            line += f"   +{over[name]:.2f} ms over none"
        print(line)
    py, nat = over["python tool shell"], over["native tool shell"]
    verdict = "met" if nat <= 3.0 else "NOT met"
    ratio = f"{py / nat:.0f}x less" if nat > 0 else "no measurable cost"
    print(f"  native adds {nat:.2f} ms, python {py:.2f} ms ({ratio}); aim ≤ 3 ms: {verdict}")


if __name__ == "__main__":
    main()
