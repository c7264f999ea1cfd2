"""Pipeline overhead of the Computer (quality.md: ≤ 40 ms over the sandbox's own spawn time).

Measured side by side in one run, with the fake engine (tests/support/fake_opencode.py)
in the real sandbox through the real launcher:

- spawn: the sandbox's own cost — `OpenCodeEngine.run_turn` called directly
  (no server, no runner) → the fake engine's first act (its dump file is written).
- post → engine: a user message posted to the real crew-server → the same first
  act of the engine in a turn the `crew-computer` process started for it.
- reply → succeeded: the engine's `crew reply` landing on the server → the turn
  recorded as succeeded (both server timestamps).

Usage: scripts/bench pipeline [--turns N]
"""

from __future__ import annotations

import argparse
import os
import statistics
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

from computer_service.bootstrap import Bootstrap  # noqa: E402
from computer_service.engine.base import EngineEvent, SessionPlan, TurnRequest  # noqa: E402
from computer_service.parts import LocalParts  # noqa: E402
from computer_service.upstream import AgentRecord  # noqa: E402
from tests.computer.computer_proc import (  # noqa: E402
    FAKE_OPENCODE,
    Machine,
    bootstrap_for,
    launch,
    machine,
    wait_for,
)
from tests.support.crew_server_proc import CrewServer, start_crew_server  # noqa: E402


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
            opencode_path=FAKE_OPENCODE,
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
        health = wait_for("the launcher's health", self.computer.health_known, 60)
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

        turn = wait_for(f"turn {n}", nth_finished, 30)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=15)
    args = parser.parse_args()
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
