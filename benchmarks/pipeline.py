"""Pipeline overhead of the Computer (quality.md: ≤ 40 ms over the sandbox's own spawn time).

Measured side by side in one run, with the fake engine (crew_testkit/fake_opencode.py)
in the real sandbox through the real launcher:

- spawn: the sandbox's own cost — `OpenCodeEngine.run_turn` called directly
  (no server, no runner) → the fake engine's first act (its dump file is written).
- post → engine: a user message posted to the real crew-server → the same first
  act of the engine in a turn the `crew-computer` process started for it.
- reply → succeeded: the engine's `crew reply` landing on the server → the turn
  recorded as succeeded (both server timestamps).

Also, with `--part start|events|agents|all`, the other Computer rows of quality.md:
start → ready against importing the dependencies alone; 50,000 engine events
reported in order with the Computer's CPU per event; 200 agents woken at once
(scripted 1 s engine): cap held, all done, peak RSS, CPU while idle.

Usage: scripts/bench pipeline [--part pipeline|start|events|agents|all] [--turns N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import anyio  # noqa: E402
import httpx  # noqa: E402
import orjson  # noqa: E402

from computer_service.__main__ import read_bootstrap_line  # noqa: E402
from computer_service.bootstrap import Bootstrap, parse_bootstrap  # noqa: E402
from computer_service.engine.base import (  # noqa: E402
    EngineEvent,
    SessionPlan,
    TurnRequest,
    TurnResult,
)
from computer_service.home import AgentHome  # noqa: E402
from computer_service.parts import LocalParts  # noqa: E402
from computer_service.parts_protocol import LauncherStatus  # noqa: E402
from computer_service.run_dir import RunDirectory  # noqa: E402
from computer_service.service import ComputerService  # noqa: E402
from computer_service.upstream import AgentRecord  # noqa: E402
from crew_common.layout import AgentPaths  # noqa: E402
from crew_harness.waiting import wait_until, wait_until_async  # noqa: E402
from crew_testkit.computer_proc import (  # noqa: E402
    FAKE_OPENCODE,
    Machine,
    bootstrap_for,
    launch,
    machine,
)
from crew_testkit.crew_server_proc import CrewServer, start_crew_server  # noqa: E402
from crew_testkit.rig import rig  # noqa: E402
from crew_testkit.scripted import ScriptedEngine, sleeping  # noqa: E402


def dumps_of(work: Path) -> list[Path]:
    d = work / ".fake-opencode"
    return sorted(d.iterdir()) if d.exists() else []


@dataclass
class Samples:
    spawn: list[float] = field(default_factory=list)
    winddown: list[float] = field(default_factory=list)
    post_to_start: list[float] = field(default_factory=list)
    reply_to_done: list[float] = field(default_factory=list)


class DirectEngine:
    """The sandbox on its own: `OpenCodeEngine.run_turn` with no server and no runner."""

    def __init__(self, crew_home: Path) -> None:
        boot = Bootstrap(
            server_url="http://127.0.0.1:9", token="unused", crew_home=crew_home,
            opencode_path=FAKE_OPENCODE, engine_mode="cold",
        )  # fmt: skip
        self.parts = LocalParts(boot)
        self.agent = AgentRecord(id=str(uuid.uuid4()), handle="spawn", name="S", model="local/fake")

    async def start(self) -> None:
        status = await self.parts.start_launcher()
        if status.unavailable_reason():
            raise SystemExit(f"the sandbox is not usable here: {status.unavailable_reason()}")
        self.parts.prepare_run_dir()
        self.engine = self.parts.engine()
        self.work = self.parts.prepare_agent(self.agent, "not-a-real-token").paths.work_dir

    async def stop(self) -> None:
        await self.parts.stop_launcher()
        self.parts.remove_run_dir()

    async def measure(self) -> tuple[float, float]:
        """(spawn: run_turn called → dump written, wind-down: tool done → run_turn returned)."""
        tool_done: list[float] = []

        async def sink(event: EngineEvent) -> None:
            if event.type == "tool_use":
                tool_done.append(datetime.fromisoformat(event.at).timestamp())

        request = TurnRequest(
            agent_id=self.agent.id, model=self.agent.model, plan=SessionPlan(None),
            render_input=lambda new: "please run:\nFAKE:RUN true\n",
        )  # fmt: skip
        before = len(dumps_of(self.work))
        t0 = time.time()
        result = await self.engine.run_turn(request, sink, anyio.Event())
        returned = time.time()
        if result.status != "succeeded":
            raise SystemExit(f"direct engine run failed: {result.failure}")
        return dumps_of(self.work)[before].stat().st_mtime - t0, returned - tool_done[-1]


class ComputerPipeline:
    """A real `crew-computer` against a real crew-server: one agent, one DM."""

    def __init__(self, server: CrewServer, m: Machine) -> None:
        self.server = server
        comp = server.create_computer()
        self.agent = server.create_agent("bench", computer_id=comp["computer_id"])
        self.room = server.create_room("dm", [self.agent["id"]])
        self.computer = launch(m, bootstrap_for(server.url, comp["token"], m))
        health = wait_until("the launcher's health", self.computer.health_known, 60)
        if not health["sandbox"]["ok"]:
            raise SystemExit(f"the sandbox is not usable: {health['sandbox']['reason']}")
        self.work = m.crew_home / "agents" / self.agent["id"] / "work"
        self.turns = 0

    def measure(self) -> tuple[float, float]:
        """(post → engine's dump written, crew reply created → turn finished), server clock for the second."""
        n = self.turns
        self.turns += 1
        room_id = self.room["id"]
        t0 = time.time()
        self.server.post(room_id, f"please answer:\nFAKE:RUN echo pong {n} | crew reply {room_id}")

        def nth_finished() -> dict[str, Any] | None:
            done = [
                t for t in reversed(self.server.turns(self.agent["id"])) if t["status"] != "running"
            ]
            return done[n] if len(done) > n else None

        turn = wait_until(f"turn {n}", nth_finished, 30)
        if turn["status"] != "succeeded":
            raise SystemExit(
                f"turn {n} {turn['status']}: {turn['failure']}\n{self.computer.stderr()[-2000:]}"
            )
        reply = next(
            msg for msg in self.server.messages(room_id)
            if msg["author"]["kind"] == "agent" and msg["body"] == f"pong {n}"
        )  # fmt: skip
        finished = datetime.fromisoformat(self.server.turn(turn["id"])["finished_at"])
        replied = datetime.fromisoformat(reply["created_at"])
        return dumps_of(self.work)[n].stat().st_mtime - t0, (finished - replied).total_seconds()


def measure(turns: int) -> Samples:
    """Alternate direct runs and Computer turns, so both see the same machine load."""
    samples = Samples()
    with tempfile.TemporaryDirectory(prefix="bench-srv-") as srv, machine() as m:
        m.log_in()
        os.environ["HOME"] = str(m.home)  # the direct engine reads this login too
        with start_crew_server(Path(srv)) as server:
            pipeline = ComputerPipeline(server, m)
            direct = DirectEngine(m.root / "crew-direct")

            async def main() -> None:
                await direct.start()
                try:
                    for n in range(turns + 1):
                        spawn, winddown = await direct.measure()
                        post, reply = await anyio.to_thread.run_sync(pipeline.measure)
                        if n == 0:
                            continue  # the first of each warms caches
                        samples.spawn.append(spawn)
                        samples.winddown.append(winddown)
                        samples.post_to_start.append(post)
                        samples.reply_to_done.append(reply)
                finally:
                    await direct.stop()

            try:
                anyio.run(main)
            finally:
                code = pipeline.computer.stop()
                if code != 0:
                    print(pipeline.computer.stderr()[-3000:], file=sys.stderr)
    return samples


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:7.1f} ms"


# --- start → ready ---------------------------------------------------------------

DEPENDENCIES = "import anyio, httpx, httpx_sse, orjson, pydantic, starlette, uvicorn"


def start_to_ready(runs: int) -> None:
    """`crew-computer` start → `ready`, next to importing its dependencies alone (≤ 1.5×)."""
    ready: list[float] = []
    imports: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-srv-") as srv, machine() as m:
        m.log_in()
        with start_crew_server(Path(srv)) as server:
            comp = server.create_computer()
            for n in range(runs + 1):
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-c", DEPENDENCIES], check=True)
                imported = time.perf_counter() - t0
                t0 = time.perf_counter()
                c = launch(m, bootstrap_for(server.url, comp["token"], m))
                said_ready = time.perf_counter() - t0
                wait_until("the launcher's health", c.health_known, 60)  # let it settle, then stop
                c.stop()
                if n:
                    ready.append(said_ready)
                    imports.append(imported)
    ratio = statistics.median(ready) / statistics.median(imports)
    print(f"start → ready, {runs} runs, medians:")
    print(f"  importing the dependencies alone   {ms(imports)}")
    print(f"  crew-computer start → ready        {ms(ready)}   ratio {ratio:.2f}×  (target ≤ 1.5×)")


# --- event reporting --------------------------------------------------------------


def event_reporting(count: int) -> None:
    """An engine printing `count` events: all arrive in order; Computer CPU per event."""

    async def flood(engine: ScriptedEngine, request: Any, on_event: Any, stop: Any) -> Any:
        for n in range(count):
            await on_event(EngineEvent("text", "2026-01-01T00:00:00.000+00:00", {"text": f"e{n}"}))
            if n % 500 == 0:
                await anyio.sleep(0)  # an engine's lines arrive over time, not in one go
        return TurnResult("succeeded", session_id="ses-flood")

    engine = ScriptedEngine(default=flood)
    with tempfile.TemporaryDirectory(prefix="bench-srv-") as srv, machine() as m:  # noqa: SIM117
        with start_crew_server(Path(srv)) as server:

            async def main() -> tuple[float, float, str]:
                async with rig(server, m.crew_home, engine) as r:
                    await r.user.post(r.room["id"], "flood please")
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    r.runner.wake()
                    await wait_until_async(
                        "the flood turn", lambda: r.metrics.turns["succeeded"], 300
                    )
                    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                    return cpu, wall, r.runner.recent[0].id

            cpu, wall, turn_id = anyio.run(main)
            events = server.turn(turn_id)["events"]
    in_order = [e["index"] for e in events] == list(range(count)) and all(
        e["data"]["text"] == f"e{n}" for n, e in enumerate(events)
    )
    print(f"event reporting, {count} events through a runner to a real crew-server:")
    print(f"  all arrived in order: {in_order} ({len(events)} stored), wall {wall:.2f} s")
    print(
        f"  Computer CPU per event: {cpu / count * 1e6:.1f} µs  (target ≤ 30 µs; includes the scripted engine)"
    )


# --- many agents --------------------------------------------------------------------


def many_agents(count: int, capacity: int) -> None:
    """`count` agents woken at once, a 1 s fake engine: cap held, all done, RSS, idle CPU."""
    with tempfile.TemporaryDirectory(prefix="bench-srv-") as srv, machine() as m:  # noqa: SIM117
        with start_crew_server(Path(srv)) as server:
            comp = server.create_computer()
            rooms = []
            for n in range(count):
                agent = server.create_agent(f"m{n}", computer_id=comp["computer_id"])
                rooms.append((agent["id"], server.create_room("dm", [agent["id"]])["id"]))
            stats = m.root / "stats.json"
            boot = {"server_url": server.url, "token": comp["token"], "crew_home": str(m.crew_home),
                    "max_concurrent_turns": capacity}  # fmt: skip
            child = subprocess.Popen(
                [sys.executable, __file__, "--child-computer", str(stats)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=m.env(),
            )  # fmt: skip
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(orjson.dumps(boot) + b"\n")
            child.stdin.flush()
            assert child.stdout.readline() == b"ready\n"
            local = httpx.Client(
                transport=httpx.HTTPTransport(uds=str(m.crew_home / "sockets" / "computer.sock")),
                base_url="http://computer",
            )
            wait_until("all runners", lambda: len(local.get("/agents").json()) == count, 60)
            t0 = time.perf_counter()
            for _, room_id in rooms:
                server.post(room_id, "everyone, wake up")
            most_running = 0

            def all_done() -> bool:
                nonlocal most_running
                health = local.get("/health").json()
                most_running = max(most_running, health["running_turns"])
                rows = local.get("/agents").json()
                return sum(r["last_result"] == "succeeded" for r in rows) == count

            wait_until(f"{count} turns", all_done, 600)
            elapsed = time.perf_counter() - t0
            time.sleep(1)
            rss_mb = _proc_kib(child.pid, "VmHWM") / 1024
            ticks0 = _cpu_ticks(child.pid)
            time.sleep(5)
            idle_cpu_s = (_cpu_ticks(child.pid) - ticks0) / os.sysconf("SC_CLK_TCK")
            local.close()
            child.stdin.close()
            child.wait(timeout=60)
            peak = orjson.loads(stats.read_bytes())["engine_peak"]
    print(f"{count} agents woken at once, fake 1 s engine, max_concurrent_turns={capacity}:")
    print(f"  every turn done in {elapsed:.1f} s (ideal {count / capacity:.0f} s)")
    print(
        f"  most engines at once: {peak} (seen running in /health: {most_running}); cap held: {peak <= capacity}"
    )
    print(
        f"  Computer peak RSS {rss_mb:.0f} MB (target ≤ 150 MB); CPU while idle for 5 s: {idle_cpu_s:.3f} s"
    )


def _proc_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class SleepyParts:
    """The service's parts with a scripted 1 s engine: the Computer's own cost, no sandbox."""

    def __init__(self, crew_home: Path, engine: ScriptedEngine) -> None:
        self.crew_home = crew_home
        self.run = RunDirectory(crew_home, "benchrun")
        self._engine = engine

    async def start_launcher(self) -> LauncherStatus:
        return LauncherStatus(True, "scripted", None, True, "scripted")

    async def stop_launcher(self) -> None:
        return None

    async def launcher_exited(self) -> int:
        await anyio.sleep_forever()
        return 0

    async def models(self) -> list[str]:
        return ["local/fake"]

    def prepare_run_dir(self) -> None:
        self.run.prepare()

    def remove_run_dir(self) -> None:
        self.run.remove()

    def engine(self) -> ScriptedEngine:
        return self._engine

    def prepare_agent(self, agent: AgentRecord, token: str) -> AgentHome:
        home = AgentHome(AgentPaths(self.crew_home, "benchrun", agent.id), agent)
        home.prepare(token)
        return home


def child_computer(stats: Path) -> None:
    """The Computer as a child process with a scripted 1 s engine (for `many_agents`)."""
    boot = parse_bootstrap(read_bootstrap_line(0))
    engine = ScriptedEngine(default=sleeping(1.0))
    parts = SleepyParts(boot.resolved_crew_home(), engine)
    service = ComputerService(boot, parts, stdout=sys.stdout.buffer, stdin_fd=0)
    anyio.run(service.serve)
    stats.write_bytes(orjson.dumps({"engine_peak": engine.peak}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["pipeline", "start", "events", "agents", "all"],
                        default="pipeline")  # fmt: skip
    parser.add_argument("--turns", type=int, default=15)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--capacity", type=int, default=max(2, os.cpu_count() or 2))
    parser.add_argument("--child-computer", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_computer:
        child_computer(args.child_computer)
        return
    if args.part in ("pipeline", "all"):
        pipeline(args)
    if args.part in ("start", "all"):
        start_to_ready(10)
    if args.part in ("events", "all"):
        event_reporting(args.events)
    if args.part in ("agents", "all"):
        many_agents(args.agents, args.capacity)


def pipeline(args: argparse.Namespace) -> None:
    """Post → engine started, and crew reply → turn succeeded, next to the sandbox alone."""
    got = measure(args.turns)
    spawn, winddown, post_start, reply_done = (
        got.spawn,
        got.winddown,
        got.post_to_start,
        got.reply_to_done,
    )
    spawn_median = statistics.median(spawn)
    over_start = statistics.median(post_start) - spawn_median
    print(f"pipeline benchmark, {args.turns} turns each, medians (fake engine, real sandbox):")
    print(f"  sandbox spawn (run_turn → engine started)         {ms(spawn)}")
    print(f"  user message posted → engine started              {ms(post_start)}"
          f"   overhead {over_start * 1000:+.1f} ms  ratio {statistics.median(post_start) / spawn_median:.2f}×")  # fmt: skip
    over_done = statistics.median(reply_done) - statistics.median(winddown)
    print(f"  sandbox wind-down (tool done → run_turn returned) {ms(winddown)}")
    print(f"  engine's crew reply → turn recorded succeeded     {ms(reply_done)}"
          f"   overhead {over_done * 1000:+.1f} ms over the wind-down")  # fmt: skip
    target = "met" if over_start <= 0.040 else "NOT met"
    print(f"  target: ≤ 40 ms over the spawn time for post → engine started: {target}")


if __name__ == "__main__":
    main()
