"""Turn overhead (quality.md: a Computer-managed turn ≤ 1.10× the same `opencode run` by hand).

Both series run the real OpenCode in the real sandbox against the scripted
model, with the same work per turn: two model requests, one bash tool call
that writes a file and runs `crew reply` (a real post to the real server).
The sandbox has its own network namespace (pasta) in the managed and the
"by hand" series; a third, "bare", runs the same by hand without it, so the
cost of the network isolation is measured side by side (ratios printed).

- managed: a user message is posted to the real `crew-server`; timed until the
  turn the real `crew-computer` ran for it is recorded as finished (the
  Computer's `/events` stream says so right after the server accepted the
  finish; no polling that would take CPU from the turn). Includes the wake-up (SSE), claiming the
  messages, registering the turn, the launcher, reporting every event,
  saving the session, the ack and the finish.
- by hand: the same `opencode run` — the launcher's own `prepare()` builds
  the bwrap argv and environment from the same typed run request the Computer
  sends (the policy `crew-launcher sandbox` uses), with the same agent
  directories, the same session, the last turn's input and the Computer's own
  PATH and LANG (the warm-up checks the engine's whole environment is the
  managed one's) — started with `subprocess` and timed from spawn to exit
  with stdout read to the end.
  Not through the `crew-launcher sandbox` command itself: it runs its
  self-test on every call (flattering the ratio) and, by design, never makes
  the run's `bin/` readable, so `crew reply` could not run in it.

Fairness on a shared machine: one warm-up of each; then pairs, the order
within a pair alternating (neither always runs right after the other's
clean-up), a short pause after each run; the ratio of medians, the median of
the per-pair ratios and the ratio of minimums are all printed, with the load
average (a loaded machine inflates the spread, not the managed side).

Where the time goes: the server's turn times, the launcher's log (when it
spawned the engine) and OpenCode's own event timestamps split a managed turn
into post → registered → spawned → first event … last event → finished; and
the CPU our processes (Computer, launcher, server, this one) spend per turn
of each kind. `--keep-log FILE` keeps OpenCode's own log of all the runs.

Usage: scripts/bench turn [--runs N] [--keep-log FILE]   (N ≥ 5, default 10)

With `--engine warm|cold` it compares one engine (docs/warm-engine.md)
with the bare `opencode run`, alternating in one run: a trivial turn (one
model call, no tool) and a tool turn (two model calls and a bash call),
each managed (post → finished) and by hand, and prints
`<engine> … median <seconds> s` per kind. It also reports the first turn
(for warm: the server's start and its first turn) and, for warm, the
server's resident memory after 20 turns and the first reply after an idle
stop with and without the prewarm hint (`benchmarks/prewarm.py`).

It also runs reply turns (one model call that runs `crew reply`, one that ends the
turn) and prints, from their traces (computer_service/turn_trace.py; the server adds
when the reply arrived and was stored), the median of each step of the critical path,
post → reply stored median and p95, OpenCode's own work and our overhead beyond it
(`critical_path` says how each is computed). `--trace-only`: the reply turns alone.

Usage: scripts/bench turn --engine warm|cold [--runs N] [--trace-only]
"""

from __future__ import annotations

import argparse
import itertools
import os
import queue
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from computer_service.engine.loopback_ports import sandbox_loopback_ports  # noqa: E402
from computer_service.engine.opencode_env import engine_env, opencode_config  # noqa: E402
from computer_service.engine.user_opencode import (  # noqa: E402
    UserOpenCode,
    read_auth,
    read_user_providers,
)
from crew_common.launcher_wire import EngineArgs, RunRequest  # noqa: E402
from crew_common.layout import AgentPaths  # noqa: E402
from crew_harness.demo import LocalStack, local_stack  # noqa: E402
from crew_harness.scripted_model import ROOM_ID, crew_reply_command, scenario  # noqa: E402
from crew_harness.waiting import wait_until  # noqa: E402
from sandbox_launcher.backend import Backend, open_backend  # noqa: E402
from sandbox_launcher.launcher import Launcher, LauncherConfig  # noqa: E402
from sandbox_launcher.network import NetworkPlan  # noqa: E402
from sandbox_launcher.tool_shell import tool_shell_base  # noqa: E402

MODEL = "local/scripted"


class TurnWatcher:
    """Follows the Computer's `/events` stream: a `turn` event is sent once the finish is recorded.

    Waiting on the stream instead of polling the server keeps the benchmark
    itself from taking CPU from the turn it measures.
    """

    def __init__(self, stack: LocalStack) -> None:
        self._socket = str(stack.computer.socket)
        self._finished: queue.Queue[float] = queue.Queue()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        transport = httpx.HTTPTransport(uds=self._socket)
        local = httpx.Client(transport=transport, base_url="http://computer", timeout=None)
        with local, local.stream("GET", "/events") as response:
            kind = None
            for line in response.iter_lines():
                if line.startswith("event:"):
                    kind = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and kind == "turn":
                    self._finished.put(time.perf_counter())

    def drain(self) -> None:
        while not self._finished.empty():
            self._finished.get_nowait()

    def next_finish(self, timeout: float) -> float:
        try:
            return self._finished.get(timeout=timeout)
        except queue.Empty:
            raise SystemExit(f"a managed turn did not finish within {timeout:.0f} s") from None


def engine_process(marker: str, found: dict[str, Any], done: threading.Event) -> None:
    """Poll for the bwrap that runs the engine (its environment holds `marker`): copy its
    argv and environment (bwrap hands the environment on to the engine unchanged)."""
    while not done.is_set() and not found:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = [a.decode() for a in f.read().split(b"\0")[:-1]]
                if not argv or not argv[0].endswith("/bwrap") or "--format" not in argv:
                    continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    pairs = [e.decode() for e in f.read().split(b"\0") if e]
            except OSError:
                continue
            env = dict(p.split("=", 1) for p in pairs)
            if env.get("CREW_TOKEN_FILE", "").startswith(marker):
                found.update(env=env, bwrap=argv)
                return
        time.sleep(0.02)


def without_session(argv: list[str]) -> list[str]:
    """The argv less the session and bwrap's per-run sync fds (the network's)."""
    if "--info-fd" in argv:
        at = argv.index("--unshare-net")
        argv = argv[:at] + argv[at + 5 :]
    if "--session" not in argv:
        return argv
    at = argv.index("--session")
    return argv[:at] + argv[at + 2 :]


def managed_turn(stack: LocalStack, watcher: TurnWatcher, room_id: str) -> float:
    """Post a message; seconds until the Computer says the turn it caused is recorded."""
    watcher.drain()
    POSTED.append(time.time())
    started = time.perf_counter()
    stack.call("POST", f"/api/rooms/{room_id}/messages", json={"body": "Please answer."})
    return watcher.next_finish(120) - started


def session_of(stack: LocalStack, agent_id: str) -> str:
    """The agent's current OpenCode session (the Computer's introspection says it)."""
    with stack.computer.introspection() as local:
        row: dict[str, Any] = local.get(f"/agents/{agent_id}").json()
    session = row.get("session_id")
    if not session:
        raise SystemExit(f"the Computer reports no session for the agent: {row}")
    return str(session)


class HandRun:
    """One `opencode run` started by hand, with or without the sandbox's own network."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        stdin: bytes,
        backend: Backend,
        plan: NetworkPlan,
    ) -> None:
        self.argv, self.env, self.stdin = argv, env, stdin
        self.backend, self.plan = backend, plan


def hand_run(stack: LocalStack, agent_id: str, turn_input: str, session: str) -> HandRun:
    """The argv, environment and stdin of the same run, built by the launcher's own code."""
    crew_home = stack.computer.crew_home.resolve()
    [run_dir] = (crew_home / "runtime").iterdir()
    paths = AgentPaths(crew_home=crew_home, run_id=run_dir.name, agent_id=agent_id)
    home = (stack.root / "home").resolve()
    user = UserOpenCode.from_env({"HOME": str(home)})
    providers = read_user_providers(user.config_files)
    env = engine_env(
        paths,
        bin_dir=paths.bin_dir,
        server_url=stack.server.url,
        auth_content=read_auth(user.auth_file),
        config_content=opencode_config(paths.agents_md, MODEL, providers),
        # What the Computer's own environment gives it (demo.user_env): the same PATH and LANG.
        base_path=os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        lang=os.environ.get("LANG", "C.UTF-8"),
    )
    # The tool shell as a managed turn gets it (each tool in its own Landlock domain).
    backend, health = open_backend(None, tool_shell_base=tool_shell_base(crew_home))
    if backend is None:
        raise SystemExit(f"no sandbox here: {health.reason}")
    launcher = Launcher(
        config=LauncherConfig(
            crew_home=crew_home, home=home, run_id=run_dir.name, opencode=BUNDLED
        ),
        backend=backend,
        sandbox=health,
        engine=None,
    )
    import crew_shim

    request = RunRequest(
        run_id=str(uuid.uuid4()),
        agent_id=agent_id,
        agent_dir=str(paths.agent_dir),
        runtime_dir=str(paths.runtime_dir),
        bin_dir=str(paths.bin_dir),
        interpreter_dirs=sorted(
            {
                str(Path(p).resolve())
                for p in (sys.prefix, sys.base_prefix, Path(crew_shim.__file__).parent)
            }
        ),
        env=env,
        stdin=turn_input,
        loopback_ports=sandbox_loopback_ports(stack.server.url, providers),
        engine_args=EngineArgs(
            session_id=session, model=MODEL, title="crew turn", dir=str(paths.work_dir)
        ),
    )
    run = launcher.prepare(request)
    if run.network is None:
        raise SystemExit("the sandbox has no network namespace here (pasta missing?)")
    plan = run.network.plan
    run.network.close()
    return HandRun(run.argv, run.env, run.stdin, backend, plan)


POSTED: list[float] = []  # wall-clock time of each managed turn's post
_SPAWN_LINE = re.compile(r"^(\S+ \S+) crew-launcher INFO run (\S+) of agent \S+ started")


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def launcher_spawns(stack: LocalStack) -> list[float]:
    """When the launcher started each engine process, in order (its log, in the Computer's stderr)."""
    found = []
    for line in stack.computer.stderr().splitlines():
        match = _SPAWN_LINE.match(line)
        if match:
            found.append(datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return found


def managed_phases(turn: dict[str, Any], posted: float, spawned: float) -> list[float]:
    """post → registered, registered → engine spawned, spawned → first event, last event → finished."""
    events = turn["events"]
    registered = _ts(turn["started_at"])
    return [
        registered - posted,
        spawned - registered,
        _ts(events[0]["at"]) - spawned,
        _ts(turn["finished_at"]) - _ts(events[-1]["at"]),
    ]


def _own_cpu(pid: int) -> float:
    """CPU seconds a process's live threads ran (schedstat, ns), its children not counted."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except OSError:
            continue  # the thread ended meanwhile
    return total / 1e9


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except OSError:
                continue
    return found


class OurCpu:
    """CPU our side spends around a turn: the Computer, its launcher, the server, this process
    (the scripted model's thread and the hand run's pipes). OpenCode's own CPU is not in it."""

    def __init__(self, stack: LocalStack) -> None:
        computer = stack.computer.proc.pid
        self.pids = {"computer": computer, "server": stack.server.proc.pid}
        for child in _children(computer):
            self.pids["launcher"] = child
        self.samples: dict[str, list[dict[str, float]]] = {"managed": [], "by hand": []}

    def read(self) -> dict[str, float]:
        now = {name: _own_cpu(pid) for name, pid in self.pids.items()}
        now["bench"] = time.process_time()
        return now

    def measure(self, kind: str, run: Any) -> float:
        before = self.read()
        result: float = run()
        after = self.read()
        self.samples[kind].append({k: after[k] - before[k] for k in before})
        return result


HAND_PHASES: list[tuple[float, float]] = []  # spawn → first event, last event → exit


def timed_hand_run(hand: HandRun, with_network: bool) -> float:
    """Spawn → exit of the hand run; with its own network namespace (pasta) when asked."""
    spawned = time.time()
    started = time.perf_counter()
    network = hand.backend.network(hand.plan) if with_network else None
    try:
        process = subprocess.Popen(
            network.argv(hand.argv) if network else hand.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=hand.env,
            start_new_session=True,
            pass_fds=network.pass_fds if network else (),
        )
        if network:
            network.spawned()
            network.attach_blocking()
        out, err = process.communicate(hand.stdin)
    finally:
        if network:
            network.close()
    elapsed = time.perf_counter() - started
    done = subprocess.CompletedProcess(hand.argv, process.returncode, out, err)
    stamps = [orjson.loads(line)["timestamp"] / 1000 for line in done.stdout.splitlines() if line]
    if stamps and with_network:
        HAND_PHASES.append((stamps[0] - spawned, spawned + elapsed - stamps[-1]))
    if done.returncode != 0 or b'"step_finish"' not in done.stdout:
        raise SystemExit(
            f"the hand-started run failed (exit {done.returncode}):\n"
            f"{done.stdout.decode(errors='replace')[-1500:]}\n{done.stderr.decode(errors='replace')[-1500:]}"
        )
    return elapsed


BUNDLED = REPO / "tools" / "opencode" / "node_modules" / ".bin" / "opencode"


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench turn", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="timed turns of each kind (≥ 5)")
    parser.add_argument(
        "--keep-log", type=Path, help="copy OpenCode's own log (both kinds of runs) here"
    )
    parser.add_argument(
        "--engine", choices=["warm", "cold"], help="compare this engine with opencode run"
    )
    parser.add_argument(
        "--trace-only",
        action="store_true",
        help="with --engine: only the reply turns and their critical path (quicker)",
    )
    args = parser.parse_args()
    runs = max(5, args.runs)
    if args.engine:
        return engine_main(args.engine, runs, args.trace_only)
    managed: list[float] = []
    by_hand: list[float] = []
    bare: list[float] = []  # by hand, without the network namespace
    load_before = os.getloadavg()[0]
    # The managed-vs-by-hand comparison is of the cold engine (one opencode run per turn).
    with local_stack(script=scenario("crew"), price_in_config=True, engine_mode="cold") as stack:
        if not stack.health["sandbox"]["ok"]:
            raise SystemExit(f"the sandbox is not usable: {stack.health['sandbox']['reason']}")
        agent = stack.create_agent("bench", "Bench", "Answers every message.", MODEL)
        room = stack.call("POST", "/api/rooms", json={"kind": "dm", "agent_ids": [agent["id"]]})
        wait_until("the Computer to take the agent", lambda: session_ready(stack, agent["id"]), 30)

        watcher = TurnWatcher(stack)
        cpu = OurCpu(stack)
        time.sleep(0.2)  # the stream is open

        # Warm-up: the first turn creates the session and OpenCode's database. Its
        # engine's environment is read on the way, to check the hand run gets the same.
        managed_run: dict[str, Any] = {}
        seen = threading.Event()
        spy = threading.Thread(
            target=engine_process, args=(str(stack.computer.crew_home), managed_run, seen)
        )
        spy.start()
        managed_turn(stack, watcher, room["id"])
        seen.set()
        spy.join()
        last = stack.finished_turn(agent["id"], 0, 10)
        hand = hand_run(stack, agent["id"], last["input"], session_of(stack, agent["id"]))
        argv, env = hand.argv, hand.env
        managed_env = managed_run.get("env", {})
        differ = sorted(k for k in {*env, *managed_env} if env.get(k) != managed_env.get(k))
        if not managed_env or differ:
            shown = {k: (env.get(k), managed_env.get(k)) for k in differ}
            raise SystemExit(f"the hand run's environment differs from the managed one: {shown}")
        # The warm-up started the session the hand runs continue: compare all but that.
        network = hand.backend.network(hand.plan)
        networked = network.argv(argv) if network else argv
        if network:
            network.close()
        if without_session(managed_run["bwrap"]) != without_session(networked[2:]):
            raise SystemExit(f"the argv differs:\n{managed_run['bwrap']}\n{networked[2:]}")
        timed_hand_run(hand, with_network=True)
        timed_hand_run(hand, with_network=False)

        series = {"managed": managed, "by hand": by_hand, "bare": bare}
        for i in range(runs):
            # Rotate the order, so none always follows another's clean-up.
            pair = {
                "managed": lambda: managed_turn(stack, watcher, room["id"]),
                "by hand": lambda: timed_hand_run(hand, with_network=True),
                "bare": lambda: timed_hand_run(hand, with_network=False),
            }
            order = ["managed", "by hand", "bare"]
            for kind in order[i % 3 :] + order[: i % 3]:
                if kind == "bare":
                    series[kind].append(pair[kind]())
                else:
                    series[kind].append(cpu.measure(kind, pair[kind]))
                time.sleep(0.3)  # let the finished one's clean-up settle
            print(
                f"  run {i + 1}/{runs}: managed {managed[-1]:.3f} s, by hand {by_hand[-1]:.3f} s, "
                f"bare {bare[-1]:.3f} s",
                flush=True,
            )
        listed = stack.call("GET", "/api/turns", params={"agent_id": agent["id"]})
        if any(t["status"] != "succeeded" for t in listed):
            raise SystemExit(f"not every managed turn succeeded: {[t['status'] for t in listed]}")
        records = [stack.call("GET", f"/api/turns/{t['id']}") for t in reversed(listed)]
        spawns = launcher_spawns(stack)
        if len(spawns) != len(records):
            raise SystemExit(
                f"{len(spawns)} engine starts in the launcher log for {len(records)} turns"
            )
        phases = [
            managed_phases(t, p, sp)
            for t, p, sp in zip(records[1:], POSTED[1:], spawns[1:], strict=True)
        ]
        if args.keep_log:
            crew_home = stack.computer.crew_home
            log = crew_home / "agents" / agent["id"] / "engines" / "opencode" / "data"
            shutil.copyfile(log / "opencode" / "log" / "opencode.log", args.keep_log)
    load_after = os.getloadavg()[0]

    m, h, b = statistics.median(managed), statistics.median(by_hand), statistics.median(bare)
    paired = statistics.median(a / b for a, b in zip(managed, by_hand, strict=True))
    paired_bare = statistics.median(a / b for a, b in zip(managed, bare, strict=True))
    paired_net = statistics.median(a / b for a, b in zip(by_hand, bare, strict=True))
    backend = stack.health["sandbox"].get("backend")
    print()
    print(f"turn: real opencode in {backend}, scripted model; 2 model calls + bash + crew reply")
    print(
        f"  Computer-managed turn, post → finished   median {m:.3f} s  min {min(managed):.3f}  max {max(managed):.3f}  (n={runs})"
    )
    print(
        f"  same opencode run by hand, spawn → exit  median {h:.3f} s  min {min(by_hand):.3f}  max {max(by_hand):.3f}  (n={runs})"
    )
    print(
        f"  same run by hand, no network namespace   median {b:.3f} s  min {min(bare):.3f}  max {max(bare):.3f}  (n={runs})"
    )
    print(f"  ratio of medians                         {m / h:.3f}×  (target ≤ 1.10×)")
    print(
        f"  managed / bare (no network namespace)    {m / b:.3f}×  (paired {paired_bare:.3f}×; target ≤ 1.10×)"
    )
    print(
        f"  network namespace on / off, by hand      {h / b:.3f}×  (paired {paired_net:.3f}×, "
        f"{1000 * (h - b):+.0f} ms: pasta and its attach)"
    )
    print(
        f"  median of the paired ratios              {paired:.3f}×  (each managed turn / the hand run next to it)"
    )
    print(
        f"  ratio of minimums                        {min(managed) / min(by_hand):.3f}×  (least disturbed by other load)"
    )
    print(f"  overhead per turn (medians)              {1000 * (m - h):.0f} ms")
    med = [1000 * statistics.median(column) for column in zip(*phases, strict=True)]
    hand = [1000 * statistics.median(x) for x in zip(*HAND_PHASES[1:], strict=True)]
    print("  where the time goes (medians; server, launcher-log and engine timestamps, ±1 ms):")
    print(
        f"    managed: post → turn registered {med[0]:.0f} ms, registered → engine spawned {med[1]:.0f} ms, "
        f"spawned → first engine event {med[2]:.0f} ms, last event → finished {med[3]:.0f} ms"
    )
    print(
        f"    by hand: spawn → first engine event {hand[0]:.0f} ms, last event → exit {hand[1]:.0f} ms"
    )
    print("  CPU of our processes during a turn (medians, ms; OpenCode's own not counted):")
    for kind, rows in cpu.samples.items():
        parts = ", ".join(
            f"{name} {1000 * statistics.median(r[name] for r in rows):.0f}" for name in rows[0]
        )
        print(f"    {kind}: {parts}")
    print(
        f"  load average (1 min) before {load_before:.2f}, after {load_after:.2f} on {os.cpu_count()} CPUs"
        # The runs themselves load the machine: only the load before them tells of neighbours.
        + ("  — a busy machine: rerun on a quiet one" if load_before > 0.5 else "")
    )
    return 0


ENGINE_SCRIPT = {
    "rules": [
        {"match": "TOOLTURN", "reply": {"bash": "echo hello > out.txt"}},
        # The reply turn: one model call that runs `crew reply`, one more that ends the turn.
        {
            "role": "user",
            "match": "REPLYTURN",
            "capture": {"room": rf"crew reply ({ROOM_ID})"},
            "reply": {"bash": crew_reply_command("room", "ok")},
        },
    ]
}
ENGINE_KINDS = {"trivial": "Please say ok.", "tool": "TOOLTURN: please write out.txt."}
REPLY_BODY = "REPLYTURN: please answer."


def engine_main(engine: str, runs: int, trace_only: bool = False) -> int:
    """`--engine`: one engine against `opencode run`, trivial and tool turns (module doc),
    and the reply turns whose traces give the critical path (`--trace-only`: those alone)."""
    from crew_harness.scripted_model import Script

    times: dict[str, list[float]] = {
        f"{e} {k}": [] for e in (engine, "by hand") for k in ENGINE_KINDS if not trace_only
    }
    times[f"{engine} reply"] = []
    load_before = os.getloadavg()[0]
    with local_stack(
        script=Script.parse(ENGINE_SCRIPT), price_in_config=True, engine_mode=engine
    ) as stack:
        if not stack.health["sandbox"]["ok"]:
            raise SystemExit(f"the sandbox is not usable: {stack.health['sandbox']['reason']}")
        agent = stack.create_agent("bench", "Bench", "Answers every message.", MODEL)
        room = stack.call("POST", "/api/rooms", json={"kind": "dm", "agent_ids": [agent["id"]]})
        wait_until("the Computer to take the agent", lambda: session_ready(stack, agent["id"]), 30)
        watcher = TurnWatcher(stack)
        time.sleep(0.2)  # the stream is open

        def managed(body: str) -> float:
            watcher.drain()
            started = time.perf_counter()
            stack.call("POST", f"/api/rooms/{room['id']}/messages", json={"body": body})
            return watcher.next_finish(180) - started

        first = managed(ENGINE_KINDS["trivial"])  # warm: starts the server, boots its instance
        turns = 1
        hand: dict[str, HandRun] = {}
        kinds = {} if trace_only else ENGINE_KINDS
        for kind, body in kinds.items():
            managed(body)
            last = stack.finished_turn(agent["id"], turns, 30)
            turns += 1
            hand[kind] = hand_run(stack, agent["id"], last["input"], session_of(stack, agent["id"]))
            timed_hand_run(hand[kind], True)  # the hand runs' warm-up (own network, as managed)
        managed(REPLY_BODY)  # the reply turn's warm-up
        turns += 1
        for i in range(runs):
            times[f"{engine} reply"].append(managed(REPLY_BODY))
            turns += 1
            time.sleep(0.2)
            for kind, body in kinds.items():
                pair = {
                    engine: lambda b=body: managed(b),
                    "by hand": lambda k=kind: timed_hand_run(hand[k], True),
                }
                for who in (engine, "by hand") if i % 2 == 0 else ("by hand", engine):
                    times[f"{who} {kind}"].append(pair[who]())
                    turns += who == engine
                    time.sleep(0.2)
            print(
                f"  run {i + 1}/{runs}: "
                + ", ".join(f"{name} {values[-1]:.3f} s" for name, values in times.items()),
                flush=True,
            )
        while turns < 21 and not trace_only:  # the memory figure is after 20 turns
            managed(ENGINE_KINDS["tool" if turns % 2 else "trivial"])
            turns += 1
        with stack.computer.introspection() as local:
            row = local.get(f"/agents/{agent['id']}").json()
        listed = stack.call("GET", "/api/turns", params={"agent_id": agent["id"], "limit": 200})
        if any(t["status"] != "succeeded" for t in listed):
            raise SystemExit(f"not every managed turn succeeded: {[t['status'] for t in listed]}")
        # The timed reply turns (oldest first, the warm-up left out): their traces.
        replies = [
            stack.call("GET", f"/api/turns/{t['id']}")
            for t in reversed(listed)
            if REPLY_BODY in t["input"]
        ][1:]
        if len(replies) != runs or any(
            not t["trace"] or "reply_stored" not in t["trace"] for t in replies
        ):
            raise SystemExit(
                f"a reply turn has no reply in its trace: {[t['trace'] for t in replies]}"
            )
    load_after = os.getloadavg()[0]
    print()
    print(f"turn --engine {engine}: real opencode, scripted model, managed post → finished")
    for name, values in times.items():
        label = name if not name.startswith("by hand") else "opencode run by hand " + name[8:]
        print(
            f"  {label:<28} median {statistics.median(values):.3f} s  "
            f"min {min(values):.3f}  max {max(values):.3f}  (n={len(values)})"
        )
    print(
        f"  first turn (post → finished)   {first:.3f} s"
        + ("  (starts the server)" if engine == "warm" else "")
    )
    for line in critical_path(replies):
        print(line)
    state = row.get("engine") or {}
    if engine == "warm" and not trace_only:
        rss = state.get("warm_rss_bytes")
        shown = f"{rss / 2**20:.0f} MiB" if isinstance(rss, int) else "unknown"
        print(f"  warm server RSS after {turns} turns   {shown}")
    print(
        f"  load average (1 min) before {load_before:.2f}, after {load_after:.2f} on {os.cpu_count()} CPUs"
    )
    if engine == "warm":
        # Issue 26: the prewarm hint, on a stack of its own (benchmarks/prewarm.py).
        from prewarm import first_replies, first_reply_line

        print("  " + first_reply_line(first_replies(max(3, runs // 2))))
    return 0


# A trace's steps in their order on the reply's path (computer_service/turn_trace.py; the
# server adds reply_received and reply_stored), and what each step's time is.
PATH = [
    ("post", "message posted"),
    ("wake", "wake-up reached the runner"),
    ("claimed", "claim answered"),
    ("registered", "registration answered"),
    ("server_ready", "warm server handed out"),
    ("prompt_sent", "prompt sent to the warm server"),
    ("engine_accepted", "prompt accepted / process started"),
    ("first_token", "first model event"),
    ("reply_received", "`crew reply` reached the server"),
    ("reply_stored", "reply stored"),
]


def p95(values: list[float]) -> float:
    """The 95th percentile, nearest rank (with few runs: the largest but the top 5 %)."""
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * 95 // 100) - 1)]


def reply_call_ms(turn: dict[str, Any]) -> int:
    """How long the turn's `crew reply` bash call took, as OpenCode measured it (its
    `tool_use` event's duration: our tool shell, bash, `crew` and its HTTP round trip)."""
    for event in turn["events"]:
        data = event["data"]
        called = orjson.dumps(data.get("input")).decode()
        took = data.get("duration_ms")
        if event["type"] == "tool_use" and "crew reply" in called and isinstance(took, int):
            return took
    raise SystemExit(f"turn {turn['id']} has no timed crew reply call")


def critical_path(turns: list[dict[str, Any]]) -> list[str]:
    """The median time per step of the reply turns, post → reply, and our overhead.

    OpenCode's own work = from the moment it gets the turn (warm: the prompt is sent;
    cold: its process started) to the reply reaching the server, less the `crew reply`
    bash call's own duration (OpenCode's measure of it; what runs in it is ours: the tool
    shell, `crew`, the HTTP round trip — it ends a little after the reply is stored, so
    this errs on our side). Our overhead = post → reply stored, less OpenCode's own work:
    the wake-up, the claim, the registration, the turn's preparation, getting the server,
    the tool call's wrapper and `crew`, and the server storing the reply. The model calls
    go through our gateway and count as OpenCode's here (`scripts/bench gateway` has them).
    """
    traces = [t["trace"] for t in turns]
    steps = [(k, label) for k, label in PATH if all(k in t for t in traces)]
    if any(t.get("first_token", 0) > t["reply_received"] for t in traces):
        # Cold: `opencode run` prints a tool call only once it finished, so the first model
        # line the Computer sees comes after the reply that call sent: not a step of its path.
        steps = [(k, label) for k, label in steps if k != "first_token"]
    lines = [
        "  critical path of a reply turn (medians of the traces, ms; each step: since the one before):"
    ]
    for (before, _), (key, label) in itertools.pairwise(steps):
        median = statistics.median(t[key] - t[before] for t in traces)
        lines.append(f"    {before + ' → ' + key:<36} {median:6.0f}   {label}")
    after = [t["acked"] - t["reply_stored"] for t in traces if "acked" in t]
    if after:
        lines.append(
            f"    {'reply_stored → acked':<36} {statistics.median(after):6.0f}   off the reply's path"
        )
    calls = [reply_call_ms(t) / 1000 for t in turns]
    total = [(t["reply_stored"] - t["post"]) / 1000 for t in traces]
    own = [
        (t["reply_received"] - t.get("prompt_sent", t["engine_accepted"])) / 1000 - call
        for t, call in zip(traces, calls, strict=True)
    ]
    ours = [a - b for a, b in zip(total, own, strict=True)]
    lines += [
        f"  post → reply stored          median {statistics.median(total):.3f} s  "
        f"p95 {p95(total):.3f} s  (n={len(total)}; aim ≤ 0.150 s warm)",
        f"  OpenCode's own work          median {1000 * statistics.median(own):.0f} ms  "
        "(gets the turn → reply reached the server, less the crew reply call)",
        f"  the crew reply bash call     median {1000 * statistics.median(calls):.0f} ms  "
        "(tool shell + bash + crew + its HTTP round trip, OpenCode's measure)",
        f"  our overhead beyond OpenCode's own work  median {1000 * statistics.median(ours):.0f} ms  "
        f"p95 {1000 * p95(ours):.0f} ms  (post → reply stored, less OpenCode's own; aim ≤ 40 ms)",
    ]
    return lines


def session_ready(stack: LocalStack, agent_id: str) -> bool:
    with stack.computer.introspection() as local:
        response = local.get(f"/agents/{agent_id}")
    return response.status_code == 200


if __name__ == "__main__":
    sys.exit(main())
