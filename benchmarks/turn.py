"""Turn overhead (quality.md: a Computer-managed turn ≤ 1.10× the same `opencode run` by hand).

Both series run the real OpenCode in the real sandbox against the scripted
model, with the same work per turn: two model requests, one bash tool call
that writes a file and runs `crew reply` (a real post to the real server).

- managed: a user message is posted to the real `crew-server`; timed until the
  turn the real `crew-computer` ran for it is recorded as finished (the
  Computer's `/events` stream says so right after the server accepted the
  finish; no polling that would take CPU from the turn). Includes the wake-up (SSE), claiming the
  messages, registering the turn, the launcher, reporting every event,
  saving the session, the ack and the finish.
- by hand: the same `opencode run` — the launcher's own `prepare()` builds
  the bwrap argv and environment from the same typed run request the Computer
  sends (the policy `crew-launcher sandbox` uses), with the same agent
  directories, the same session and the last turn's input — started with
  `subprocess` and timed from spawn to exit with stdout read to the end.
  Not through the `crew-launcher sandbox` command itself: it runs its
  self-test on every call (flattering the ratio) and, by design, never makes
  the run's `bin/` readable, so `crew reply` could not run in it.

The two alternate, after one warm-up of each, so drift hits both alike.

Usage: scripts/bench turn [--runs N]   (N ≥ 5, default 5)
"""

from __future__ import annotations

import argparse
import queue
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

from computer_service.engine.base import AgentPaths  # noqa: E402
from computer_service.engine.opencode import (  # noqa: E402
    UserOpenCode,
    engine_env,
    opencode_config,
    read_auth,
    read_user_providers,
)
from crew_server.demo import LocalStack, local_stack, wait_for  # noqa: E402
from crew_server.scripted_model import scenario  # noqa: E402
from sandbox_launcher.backend import open_backend  # noqa: E402
from sandbox_launcher.launcher import Launcher, LauncherConfig  # noqa: E402
from sandbox_launcher.schema import EngineArgs, RunRequest  # noqa: E402

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


def hand_run(
    stack: LocalStack, agent_id: str, turn_input: str, session: str
) -> tuple[list[str], dict[str, str], bytes]:
    """The argv, environment and stdin of the same run, built by the launcher's own code."""
    crew_home = stack.computer.crew_home.resolve()
    [run_dir] = (crew_home / "runtime").iterdir()
    paths = AgentPaths(crew_home=crew_home, run_id=run_dir.name, agent_id=agent_id)
    home = (stack.root / "home").resolve()
    user = UserOpenCode.from_env({"HOME": str(home)})
    env = engine_env(
        paths,
        bin_dir=paths.bin_dir,
        server_url=stack.server.url,
        auth_content=read_auth(user.auth_file),
        config_content=opencode_config(
            paths.agents_md, MODEL, read_user_providers(user.config_files)
        ),
        base_path="/usr/local/bin:/usr/bin:/bin",
        lang="C.UTF-8",
    )
    backend, health = open_backend(None)
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
        engine_args=EngineArgs(
            session_id=session, model=MODEL, title="crew turn", dir=str(paths.work_dir)
        ),
    )
    run = launcher.prepare(request)
    return run.argv, run.env, run.stdin


POSTED: list[float] = []  # wall-clock time of each managed turn's post


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def managed_phases(turn: dict[str, Any], posted: float) -> tuple[float, float, float]:
    """post → turn registered, registered → first engine event, last event → finished."""
    events = turn["events"]
    return (
        _ts(turn["started_at"]) - posted,
        _ts(events[0]["at"]) - _ts(turn["started_at"]),
        _ts(turn["finished_at"]) - _ts(events[-1]["at"]),
    )


HAND_PHASES: list[tuple[float, float]] = []  # spawn → first event, last event → exit


def timed_hand_run(argv: list[str], env: dict[str, str], stdin: bytes) -> float:
    spawned = time.time()
    started = time.perf_counter()
    done = subprocess.run(
        argv, input=stdin, env=env, capture_output=True, start_new_session=True, check=False
    )
    elapsed = time.perf_counter() - started
    stamps = [orjson.loads(line)["timestamp"] / 1000 for line in done.stdout.splitlines() if line]
    if stamps:
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
    parser.add_argument("--runs", type=int, default=5, help="timed turns of each kind (≥ 5)")
    args = parser.parse_args()
    runs = max(5, args.runs)
    managed: list[float] = []
    by_hand: list[float] = []
    with local_stack(script=scenario("crew"), price_in_config=True) as stack:
        if not stack.health["sandbox"]["ok"]:
            raise SystemExit(f"the sandbox is not usable: {stack.health['sandbox']['reason']}")
        agent = stack.create_agent("bench", "Bench", "Answers every message.", MODEL)
        room = stack.call("POST", "/api/rooms", json={"kind": "dm", "agent_ids": [agent["id"]]})
        wait_for("the Computer to take the agent", lambda: session_ready(stack, agent["id"]), 30)

        watcher = TurnWatcher(stack)
        time.sleep(0.2)  # the stream is open

        # Warm-up: the first turn creates the session and OpenCode's database.
        managed_turn(stack, watcher, room["id"])
        last = stack.finished_turn(agent["id"], 0, 10)
        argv, env, stdin = hand_run(
            stack, agent["id"], last["input"], session_of(stack, agent["id"])
        )
        timed_hand_run(argv, env, stdin)

        for i in range(runs):
            managed.append(managed_turn(stack, watcher, room["id"]))
            by_hand.append(timed_hand_run(argv, env, stdin))
            print(
                f"  run {i + 1}/{runs}: managed {managed[-1]:.3f} s, by hand {by_hand[-1]:.3f} s",
                flush=True,
            )
        statuses = [
            t["status"] for t in stack.call("GET", "/api/turns", params={"agent_id": agent["id"]})
        ]
        if any(s != "succeeded" for s in statuses):
            raise SystemExit(f"not every managed turn succeeded: {statuses}")
        records = [
            stack.call("GET", f"/api/turns/{t['id']}")
            for t in reversed(stack.call("GET", "/api/turns", params={"agent_id": agent["id"]}))
        ]
        phases = [managed_phases(t, p) for t, p in zip(records[1:], POSTED[1:], strict=True)]

    m, h = statistics.median(managed), statistics.median(by_hand)
    backend = stack.health["sandbox"].get("backend")
    print()
    print(f"turn: real opencode in {backend}, scripted model; 2 model calls + bash + crew reply")
    print(
        f"  Computer-managed turn, post → finished   median {m:.3f} s  min {min(managed):.3f}  max {max(managed):.3f}  (n={runs})"
    )
    print(
        f"  same opencode run by hand, spawn → exit  median {h:.3f} s  min {min(by_hand):.3f}  max {max(by_hand):.3f}  (n={runs})"
    )
    print(f"  ratio of medians                         {m / h:.3f}×  (target ≤ 1.10×)")
    print(
        f"  ratio of minimums                        {min(managed) / min(by_hand):.3f}×  (least disturbed by other load)"
    )
    print(f"  overhead per turn (medians)              {1000 * (m - h):.0f} ms")
    med = [statistics.median(column) for column in zip(*phases, strict=True)]
    hand = [statistics.median(x) for x in zip(*HAND_PHASES[1:], strict=True)]
    print("  where the time goes (medians; server and engine timestamps):")
    print(
        f"    managed: post → turn registered {1000 * med[0]:.0f} ms, registered → first engine event "
        f"{1000 * med[1]:.0f} ms, last event → finished {1000 * med[2]:.0f} ms"
    )
    print(
        f"    by hand: spawn → first engine event {1000 * hand[0]:.0f} ms, last event → exit "
        f"{1000 * hand[1]:.0f} ms"
    )
    return 0


def session_ready(stack: LocalStack, agent_id: str) -> bool:
    with stack.computer.introspection() as local:
        response = local.get(f"/agents/{agent_id}")
    return response.status_code == 200


if __name__ == "__main__":
    sys.exit(main())
