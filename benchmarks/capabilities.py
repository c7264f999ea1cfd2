"""`scripts/bench capabilities`: what one MCP server costs a warm agent — at server start and per call.

Side by side, alternating in one run, the real OpenCode (`opencode serve --pure`, the warm
engine's server) against the scripted model:

- start: spawn → the server's instance is ready (`GET /mcp?directory=…` answers; the
  instance boots on the first request that names the directory, and that is when OpenCode
  starts the local MCP servers and lists their tools), for a server with no `mcp` section
  and for one with one local stdio MCP server (`crew_testkit/mcp_stdio.py`), then its first
  turn.
- per call: on one warm server with the MCP server, a turn whose one tool call is the MCP
  tool (`notes_echo_note`) against the same turn whose one tool call is `bash` (`echo`),
  and a turn with no tool at all. Each is two model requests except the last (one).

By hand, not through the Computer: no sandbox, no launcher, no crew server — so the figures
are OpenCode's own cost of the capability (what any way of running it pays); the Computer
adds its own sandbox start on top of both sides of the start pair equally, and the
tool shell (`tool_shell.py`) runs for `bash` but never for an MCP call (OpenCode spawns
the MCP server directly). Prints medians and ratios; the load average with them.

With `--sandboxed` the same pairs go through the Computer's own warm way instead (the
real launcher and sandbox, `crew_testkit.engine_rig.EngineRig`, the agent's capabilities
in its `TurnRequest` as the runner passes them): the first turn of a fresh warm server
(sandbox + `opencode serve` start + the turn) for an agent without and with the MCP
server, and warm turns with an MCP call, a bash call (through the tool shell) and none.

Usage: scripts/bench capabilities [--runs N] [--sandboxed]   (N ≥ 3, default 5)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from crew_harness.scripted_model import Script, ScriptedModel, opencode_provider  # noqa: E402
from tests.e2e.opencode_by_hand import OPENCODE, OpenCodeHome, scripted_config  # noqa: E402

MCP_STDIO = ROOT / "crew_testkit" / "mcp_stdio.py"
SYSTEM_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
PASSWORD = "bench-password"
LISTENING = re.compile(r"listening on (http://\S+)")
SCRIPT = {
    "rules": [
        {
            "role": "user",
            "match": "CALL-MCP",
            "reply": {"tool_calls": [{"name": "notes_echo_note", "arguments": {"note": "b"}}]},
        },
        {"role": "user", "match": "CALL-BASH", "reply": {"bash": "echo b"}},
    ]
}


def mcp_section() -> dict[str, Any]:
    """One local stdio MCP server, as the Computer would write it for an agent."""
    return {"notes": {"type": "local", "command": [SYSTEM_PYTHON, str(MCP_STDIO)]}}


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    http: httpx.Client
    work: Path
    spawned: float
    listening: float


@contextmanager
def serve(root: Path, config: dict[str, Any]) -> Iterator[Served]:
    """One `opencode serve --pure` in a throwaway home; stopped (and its group killed) at exit."""
    home = OpenCodeHome(root).prepare()
    env = {**home.env(config), "OPENCODE_SERVER_PASSWORD": PASSWORD}
    spawned = time.perf_counter()
    proc = subprocess.Popen(
        [str(OPENCODE), "serve", "--pure", "--port", "0", "--hostname", "127.0.0.1"],
        cwd=home.work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:
            if found := LISTENING.search(line.decode(errors="replace")):
                url = found.group(1)
                break
        if url is None:
            raise RuntimeError(f"opencode serve exited {proc.wait()} before listening")
        listening = time.perf_counter()
        params = {"directory": str(home.work)}
        with httpx.Client(
            base_url=url, auth=("opencode", PASSWORD), params=params, timeout=60
        ) as http:
            yield Served(proc, http, home.work, spawned, listening)
    finally:
        with_group_killed(proc)


def with_group_killed(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server, then kill what is left of its process group (an MCP child)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def turn(served: Served, text: str) -> float:
    """One synchronous turn in a new session; seconds from the prompt to its answer."""
    return timed_turn(served, text)[0]


def timed_turn(served: Served, text: str) -> tuple[float, str]:
    """One synchronous turn in a new session: (seconds from the prompt to its answer, session)."""
    session = served.http.post("/session", json={"title": "bench"}).json()["id"]
    started = time.perf_counter()
    answer = served.http.post(
        f"/session/{session}/message",
        json={
            "parts": [{"type": "text", "text": text}],
            "model": {"providerID": "local", "modelID": "scripted"},
        },
    )
    elapsed = time.perf_counter() - started
    answer.raise_for_status()
    return elapsed, session


def check_mcp_turn(served: Served, session: str) -> None:
    """The MCP call really ran: the session's tool part has the server's marker."""
    messages = served.http.get(f"/session/{session}/message").json()
    outputs = [
        p["state"].get("output", "")
        for m in messages
        for p in m["parts"]
        if p["type"] == "tool" and p["tool"] == "notes_echo_note"
    ]
    if not any("MCP-ECHO-MARKER" in o for o in outputs):
        raise RuntimeError(f"the MCP tool call did not answer: {outputs}")


def start_once(root: Path, provider: dict[str, Any], with_mcp: bool) -> tuple[float, float]:
    """(spawn → instance ready, first turn) for one fresh server with or without the MCP server."""
    config = scripted_config(provider)
    if with_mcp:
        config["mcp"] = mcp_section()
    with serve(root, config) as served:
        status = served.http.get("/mcp").json()
        ready = time.perf_counter() - served.spawned
        if with_mcp and status.get("notes", {}).get("status") != "connected":
            raise RuntimeError(f"the MCP server did not connect: {status}")
        first = turn(served, "CALL-MCP" if with_mcp else "CALL-BASH")
    return ready, first


def median(values: list[float]) -> float:
    return statistics.median(values)


def ms(value: float) -> str:
    return f"{value * 1000:7.1f} ms"


def spread(values: list[float]) -> str:
    """Every sample, sorted, in seconds: the spread a median hides on a shared machine."""
    return "[" + " ".join(f"{v:.2f}" for v in sorted(values)) + "] s"


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench capabilities")
    parser.add_argument("--runs", type=int, default=5, help="server starts per side (≥ 3)")
    parser.add_argument(
        "--sandboxed", action="store_true", help="through the Computer's warm way and sandbox"
    )
    args = parser.parse_args()
    if args.runs < 3:
        parser.error("--runs must be at least 3")
    if not OPENCODE.exists():
        print(f"OpenCode is not installed at {OPENCODE}: run scripts/setup", file=sys.stderr)
        return 1
    base = Path(tempfile.mkdtemp(prefix="crew-bench-caps-"))
    try:
        with ScriptedModel(Script.parse(SCRIPT)) as model:
            if args.sandboxed:
                return anyio.run(sandboxed, base, model, args.runs)
            provider = opencode_provider(model.base_url)
            return run(base, provider, args.runs)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run(base: Path, provider: dict[str, Any], runs: int) -> int:
    print(f"OpenCode {OPENCODE} by hand, scripted model; load average {os.getloadavg()}")
    ready: dict[bool, list[float]] = {False: [], True: []}
    first: dict[bool, list[float]] = {False: [], True: []}
    start_once(base / "warmup", provider, True)  # page in the binary and python
    for i in range(runs):
        order = (False, True) if i % 2 == 0 else (True, False)
        for with_mcp in order:
            r, f = start_once(base / f"start-{i}-{int(with_mcp)}", provider, with_mcp)
            ready[with_mcp].append(r)
            first[with_mcp].append(f)
    calls: dict[str, list[float]] = {"mcp": [], "bash": [], "none": []}
    config = {**scripted_config(provider), "mcp": mcp_section()}
    with serve(base / "calls", config) as served:
        served.http.get("/mcp")
        check_mcp_turn(served, timed_turn(served, "CALL-MCP")[1])  # warm-up of each kind
        turn(served, "CALL-BASH")
        turn(served, "hello")
        kinds = [("mcp", "CALL-MCP"), ("bash", "CALL-BASH"), ("none", "hello")]
        for i in range(4 * runs):
            for kind, text in kinds[i % 3 :] + kinds[: i % 3]:
                calls[kind].append(turn(served, text))
    without, with_ = median(ready[False]), median(ready[True])
    print(f"\nserver start → instance ready (n={runs} each)")
    print(f"  without MCP  median {ms(without)}   {spread(ready[False])}")
    print(
        f"  with 1 MCP   median {ms(with_)}   +{ms(with_ - without)}  ({with_ / without:.2f}×)"
        f"   {spread(ready[True])}"
    )
    f0, f1 = median(first[False]), median(first[True])
    print("first turn on that server (bash call vs MCP call)")
    print(f"  without MCP  median {ms(f0)}")
    print(f"  with 1 MCP   median {ms(f1)}   +{ms(f1 - f0)}  ({f1 / f0:.2f}×)")
    m, b, n = (median(calls[k]) for k in ("mcp", "bash", "none"))
    print(f"\nwarm turn with one tool call (n={4 * runs} each, one server with the MCP server)")
    print(f"  no tool      median {ms(n)}")
    print(f"  bash call    median {ms(b)}   tool step {ms(b - n)}")
    print(f"  MCP call     median {ms(m)}   tool step {ms(m - n)}")
    print(f"  MCP call over bash call: {ms(m - b)}  ({m / b:.2f}×)")
    print(f"load average after: {os.getloadavg()}")
    return 0


async def sandboxed(base: Path, model: ScriptedModel, runs: int) -> int:
    """The pairs through the Computer's warm way: launcher, sandbox, warm pool."""
    from computer_service.engine.base import EngineEvent, TurnRequest, TurnResult
    from crew_common.capabilities import parse
    from crew_common.permissions import PermissionPolicy
    from crew_testkit.engine_rig import MODEL, EngineRig

    os.environ["HOME"] = str(base / "home")  # EngineRig writes the user's login there
    (base / "home").mkdir(parents=True)
    caps = parse(
        {
            "mcp_servers": [
                {"type": "local", "name": "notes", "command": [SYSTEM_PYTHON, str(MCP_STDIO)]}
            ]
        }
    )
    none = parse({})
    print(f"OpenCode {OPENCODE} through the Computer's warm way (sandboxed), scripted model")
    print(f"load average {os.getloadavg()}")
    async with EngineRig(model, OPENCODE) as rig:
        for agent_id in ("plain", "mcp"):
            home = rig.agent(agent_id)
            shutil.copy(MCP_STDIO, home.paths.work_dir / "mcp_stdio.py")

        async def turn_of(agent_id: str, text: str) -> tuple[float, TurnResult, list[EngineEvent]]:
            engine = rig.warm
            home = rig.homes[agent_id]
            events: list[EngineEvent] = []

            async def on_event(event: EngineEvent) -> None:
                events.append(event)

            request = TurnRequest(
                agent_id=agent_id,
                model=MODEL,
                plan=engine.plan_session(agent_id, MODEL, home.agents_md),
                render_input=lambda new: text,
                wall_clock_limit_s=120.0,
                permission=PermissionPolicy(),
                capabilities=caps if agent_id == "mcp" else none,
            )
            started = time.perf_counter()
            result = await engine.run_turn(request, on_event, anyio.Event())
            elapsed = time.perf_counter() - started
            if result.status != "succeeded":
                raise RuntimeError(f"{agent_id} {text}: {result.failure}")
            return elapsed, result, events

        async def stop_server(agent_id: str) -> None:
            if (server := rig.pool.servers.get(agent_id)) is not None:
                await rig.pool.discard(server)

        first: dict[bool, list[float]] = {False: [], True: []}
        for agent_id in ("plain", "mcp"):  # warm-up: page in, first sessions
            await turn_of(agent_id, "hello")
            await stop_server(agent_id)
        for i in range(runs):
            order = (False, True) if i % 2 == 0 else (True, False)
            for with_mcp in order:
                agent_id = "mcp" if with_mcp else "plain"
                elapsed, _, _ = await turn_of(agent_id, "CALL-BASH")
                first[with_mcp].append(elapsed)
                await stop_server(agent_id)
        _, _, events = await turn_of("mcp", "CALL-MCP")
        outputs = [e.data.get("output", "") for e in events if e.type == "tool_use"]
        if not any("MCP-ECHO-MARKER" in o for o in outputs):
            raise RuntimeError(f"the MCP tool call did not answer: {outputs}")
        calls: dict[str, list[float]] = {"mcp": [], "bash": [], "none": []}
        kinds = [("mcp", "CALL-MCP"), ("bash", "CALL-BASH"), ("none", "hello")]
        for i in range(4 * runs):
            for kind, text in kinds[i % 3 :] + kinds[: i % 3]:
                calls[kind].append((await turn_of("mcp", text))[0])
    f0, f1 = median(first[False]), median(first[True])
    print(f"\nfirst turn of a fresh warm server: sandbox + server start + a bash turn (n={runs})")
    print(f"  without MCP  median {ms(f0)}   {spread(first[False])}")
    print(
        f"  with 1 MCP   median {ms(f1)}   +{ms(f1 - f0)}  ({f1 / f0:.2f}×)   {spread(first[True])}"
    )
    m, b, n = (median(calls[k]) for k in ("mcp", "bash", "none"))
    print(f"\nwarm turn with one tool call (n={4 * runs} each, the agent with the MCP server)")
    print(f"  no tool      median {ms(n)}")
    print(f"  bash call    median {ms(b)}   tool step {ms(b - n)}")
    print(f"  MCP call     median {ms(m)}   tool step {ms(m - n)}")
    print(f"  MCP call over bash call: {ms(m - b)}  ({m / b:.2f}×)")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
