"""Turn overhead (quality.md: a Computer-managed turn ≤ 1.10× the same `opencode run` by hand).

Both series run the real OpenCode in the real sandbox against the scripted
model, with the same work per turn: two model requests, one bash tool call
that writes a file and runs `crew reply` (a real post to the real server).

- managed: a user message is posted to the real `crew-server`; timed until the
  turn the real `crew-computer` ran for it is recorded as finished (the
  server's API polled every 20 ms). Includes the wake-up (SSE), claiming the
  messages, registering the turn, the launcher, reporting every event,
  saving the session, the ack and the finish.
- by hand: the same `opencode run` — the launcher's own `prepare()` builds
  the bwrap argv and environment from the same typed run request the Computer
  sends (the policy `crew-launcher sandbox` uses), with the same agent
  directories, the same session and the last turn's input — started with
  `subprocess` and timed from spawn to exit with stdout read to the end. No
  self-test per run (`crew-launcher sandbox` would add one), so the ratio is
  the strict one.

The two alternate, after one warm-up of each, so drift hits both alike.

Usage: scripts/bench turn [--runs N]   (N ≥ 5, default 5)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

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
POLL_S = 0.02


def managed_turn(stack: LocalStack, agent_id: str, room_id: str, done_before: int) -> float:
    """Post a message; seconds until the turn it causes is recorded as finished."""
    started = time.perf_counter()
    stack.call("POST", f"/api/rooms/{room_id}/messages", json={"body": "Please answer."})

    def finished() -> bool:
        turns = stack.call("GET", "/api/turns", params={"agent_id": agent_id})
        return sum(t["status"] != "running" for t in turns) > done_before

    deadline = time.monotonic() + 120
    while not finished():
        if time.monotonic() > deadline:
            raise SystemExit("a managed turn did not finish within 120 s")
        time.sleep(POLL_S)
    return time.perf_counter() - started


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


def timed_hand_run(argv: list[str], env: dict[str, str], stdin: bytes) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        argv, input=stdin, env=env, capture_output=True, start_new_session=True, check=False
    )
    elapsed = time.perf_counter() - started
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

        # Warm-up: the first turn creates the session and OpenCode's database.
        managed_turn(stack, agent["id"], room["id"], 0)
        done = 1
        last = stack.finished_turn(agent["id"], 0, 10)
        argv, env, stdin = hand_run(
            stack, agent["id"], last["input"], session_of(stack, agent["id"])
        )
        timed_hand_run(argv, env, stdin)

        for i in range(runs):
            managed.append(managed_turn(stack, agent["id"], room["id"], done))
            done += 1
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
    return 0


def session_ready(stack: LocalStack, agent_id: str) -> bool:
    with stack.computer.introspection() as local:
        response = local.get(f"/agents/{agent_id}")
    return response.status_code == 200


if __name__ == "__main__":
    sys.exit(main())
