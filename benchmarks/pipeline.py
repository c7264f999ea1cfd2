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
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import anyio  # noqa: E402

from computer_service.bootstrap import Bootstrap  # noqa: E402
from computer_service.engine.base import EngineEvent, SessionPlan, TurnRequest  # noqa: E402
from computer_service.parts import LocalParts  # noqa: E402
from computer_service.upstream import AgentRecord  # noqa: E402
from tests.computer.computer_proc import (  # noqa: E402
    FAKE_OPENCODE,
    bootstrap_for,
    launch,
    machine,
    wait_for,
)
from tests.support.crew_server_proc import start_crew_server  # noqa: E402


def dumps_of(work: Path) -> list[Path]:
    d = work / ".fake-opencode"
    return sorted(d.iterdir()) if d.exists() else []


def spawn_times(home: Path, crew_home: Path, turns: int) -> list[float]:
    """The sandbox's own spawn time: run_turn called → the fake engine's dump written."""
    os.environ["HOME"] = str(home)
    boot = Bootstrap(
        server_url="http://127.0.0.1:9", token="unused", crew_home=crew_home,
        opencode_path=FAKE_OPENCODE,
    )  # fmt: skip
    parts = LocalParts(boot)
    agent = AgentRecord(id=str(uuid.uuid4()), handle="spawn", name="Spawn", model="local/fake")
    results: list[float] = []

    async def main() -> None:
        status = await parts.start_launcher()
        if status.unavailable_reason():
            raise SystemExit(f"the sandbox is not usable here: {status.unavailable_reason()}")
        try:
            parts.prepare_run_dir()
            engine = parts.engine()
            home_ = parts.prepare_agent(agent, "not-a-real-token")
            work = home_.paths.work_dir

            async def sink(event: EngineEvent) -> None:
                return None

            for _ in range(turns + 1):
                before = len(dumps_of(work))
                request = TurnRequest(
                    agent_id=agent.id, model=agent.model, plan=SessionPlan(None),
                    render_input=lambda new: "FAKE:OK\n",
                )  # fmt: skip
                t0 = time.time()
                result = await engine.run_turn(request, sink, anyio.Event())
                if result.status != "succeeded":
                    raise SystemExit(f"direct engine run failed: {result.failure}")
                dump = dumps_of(work)[before]
                results.append(dump.stat().st_mtime - t0)
        finally:
            await parts.stop_launcher()
            parts.remove_run_dir()

    anyio.run(main)
    return results[1:]  # the first run warms caches


def pipeline_times(turns: int) -> tuple[list[float], list[float]]:
    """(post → engine started, crew reply → turn succeeded) through a real crew-computer."""
    post_to_start: list[float] = []
    reply_to_done: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-srv-") as srv, machine() as m:
        m.log_in()
        with start_crew_server(Path(srv)) as server:
            comp = server.create_computer()
            agent = server.create_agent("bench", computer_id=comp["computer_id"])
            room = server.create_room("dm", [agent["id"]])
            computer = launch(m, bootstrap_for(server.url, comp["token"], m))
            try:
                health = wait_for("the launcher's health", computer.health_known, 60)
                if not health["sandbox"]["ok"]:
                    raise SystemExit(f"the sandbox is not usable: {health['sandbox']['reason']}")
                work = m.crew_home / "agents" / agent["id"] / "work"
                for n in range(turns + 1):
                    body = f"please answer:\nFAKE:RUN echo pong {n} | crew reply {room['id']}"
                    t0 = time.time()
                    server.post(room["id"], body)

                    def nth_finished(n: int = n) -> dict[str, object] | None:
                        oldest_first = reversed(server.turns(agent["id"]))
                        done = [t for t in oldest_first if t["status"] != "running"]
                        return done[n] if len(done) > n else None

                    turn = wait_for(f"turn {n}", nth_finished, 30)
                    if turn["status"] != "succeeded":
                        raise SystemExit(
                            f"turn {n} {turn['status']}: {turn['failure']}\n{computer.stderr()[-2000:]}"
                        )
                    dump = dumps_of(work)[n]
                    reply = next(
                        msg for msg in server.messages(room["id"])
                        if msg["author"]["kind"] == "agent" and f"pong {n}" in msg["body"]
                    )  # fmt: skip
                    finished = datetime.fromisoformat(server.turn(turn["id"])["finished_at"])
                    replied = datetime.fromisoformat(reply["created_at"])
                    if n > 0:  # the first turn warms caches
                        post_to_start.append(dump.stat().st_mtime - t0)
                        reply_to_done.append((finished - replied).total_seconds())
            finally:
                code = computer.stop()
                if code != 0:
                    print(computer.stderr()[-3000:], file=sys.stderr)
    return post_to_start, reply_to_done


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=15)
    args = parser.parse_args()
    with machine() as m:
        m.log_in()
        spawn = spawn_times(m.home, m.root / "crew-direct", args.turns)
    post_start, reply_done = pipeline_times(args.turns)
    spawn_median = statistics.median(spawn)
    over_start = statistics.median(post_start) - spawn_median
    print(f"pipeline benchmark, {args.turns} turns each, medians (fake engine, real sandbox):")
    print(f"  sandbox spawn (run_turn → engine started)       {ms(spawn)}")
    print(f"  user message posted → engine started            {ms(post_start)}"
          f"   overhead {over_start * 1000:+.1f} ms  ratio {statistics.median(post_start) / spawn_median:.2f}×")  # fmt: skip
    print(f"  engine's crew reply → turn recorded succeeded   {ms(reply_done)}"
          f"   ratio to spawn {statistics.median(reply_done) / spawn_median:.2f}×")  # fmt: skip
    target = "met" if over_start <= 0.040 else "NOT met"
    print(f"  target: ≤ 40 ms over the spawn time for post → engine started: {target}")


if __name__ == "__main__":
    main()
