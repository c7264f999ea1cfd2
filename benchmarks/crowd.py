"""`scripts/bench crowd`: many agents woken at once on the real OpenCode, warm and cold side by side.

`--agents N` agents (default 40) in groups of ten; one message per group wakes
them all at once. The Computer runs at most `--cap` turns at a time (default
4) and its warm servers share `--budget-mb` of memory (default 1500: room to
start two real servers at once, each reserved at 650 MB until measured). Each
engine gets a fresh stack (crew-server, scripted model, crew-computer, real
OpenCode in bwrap); the series run one after the other in one invocation.

Per engine it prints the time from the posts until every agent's turn has
finished and the ratio between the engines; every turn's status; for warm,
from `/health` sampled every 0.2 s, the most servers and the most resident
memory at once (against the budget), and from `/metrics` warm and cold turns,
starts and evictions; and how many `opencode serve` processes of its
directory run before the Computer stops and are left after (must be 0).

Usage: scripts/bench crowd [--agents N] [--cap N] [--budget-mb MB]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from crew_harness.demo import LocalStack, local_stack  # noqa: E402
from crew_harness.scripted_model import Script  # noqa: E402

MODEL = "local/scripted"


def _metrics(stack: LocalStack) -> dict[str, float]:
    with stack.computer.introspection() as local:
        text = local.get("/metrics").text
    out = {}
    for line in text.splitlines():
        if line.startswith("crew_") and "{" not in line:
            name, value = line.split()
            out[name] = float(value)
    return out


def _servers_left(crew_home: Path) -> int:
    """`opencode serve` processes on the host whose environment names this crew home."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if (
            args[0].rsplit(b"/", 1)[-1] in (b"opencode", b"opencode.exe")  # the npm package's
            and args[1:2] == [b"serve"]
            and str(crew_home).encode() in environ
        ):
            count += 1
    return count


class Samples:
    """`/health`'s warm part every 0.2 s while the crowd runs."""

    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack
        self.rows: list[dict[str, Any]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.wait(0.2):
            health = self.stack.computer.health()
            if health and health.get("warm"):
                self.rows.append(health["warm"])

    def __enter__(self) -> Samples:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def crowd(engine: str, agents: int, cap: int, budget_mb: int) -> dict[str, Any]:
    """One series: a fresh stack, the crowd woken at once, what it showed."""
    extra = {"max_concurrent_turns": cap, "warm_memory_mb": budget_mb}
    with local_stack(script=Script(), engine_mode=engine, bootstrap_extra=extra) as stack:
        crew_home = stack.computer.crew_home
        ids = [
            stack.create_agent(f"c{engine[0]}{n}", f"C{n}", "Helpful.", MODEL)["id"]
            for n in range(agents)
        ]
        rooms = [
            stack.call(
                "POST",
                "/api/rooms",
                json={"kind": "group", "title": f"g{g}", "agent_ids": ids[g : g + 10]},
            )
            for g in range(0, agents, 10)
        ]
        with Samples(stack) as samples:
            start = time.monotonic()
            for room in rooms:
                stack.call("POST", f"/api/rooms/{room['id']}/messages", json={"body": "hello all"})
            statuses = [stack.finished_turn(a, 0, 900)["status"] for a in ids]
            elapsed = time.monotonic() - start
        metrics = _metrics(stack)
        before_stop = _servers_left(crew_home)
    result = {
        "before_stop": before_stop,
        "elapsed": elapsed,
        "statuses": {s: statuses.count(s) for s in set(statuses)},
        "metrics": metrics,
        "left": _servers_left(crew_home),
        "peak_servers": max((r["servers"] for r in samples.rows), default=0),
        "peak_rss": max((r["rss_bytes"] for r in samples.rows), default=0),
    }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=40)
    parser.add_argument("--cap", type=int, default=4)
    parser.add_argument("--budget-mb", type=int, default=1500)
    args = parser.parse_args()
    print(
        f"crowd of {args.agents} agents woken at once, cap {args.cap}, "
        f"warm budget {args.budget_mb} MB; load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results = {}
    for engine in ("warm", "cold"):
        r = results[engine] = crowd(engine, args.agents, args.cap, args.budget_mb)
        m = r["metrics"]
        print(f"{engine}: all answered in {r['elapsed']:.1f} s; turns {r['statuses']}", flush=True)
        if engine == "warm":
            print(
                f"  warm turns {m.get('crew_warm_turns_total', 0):.0f}, cold turns "
                f"{m.get('crew_cold_turns_total', 0):.0f}, starts "
                f"{m.get('crew_warm_starts_total', 0):.0f}, evictions "
                f"{m.get('crew_warm_evictions_total', 0):.0f}"
            )
            print(
                f"  most servers at once {r['peak_servers']}, most resident memory at once "
                f"{r['peak_rss'] / 2**20:.0f} MiB (budget {args.budget_mb} MB)"
            )
        print(
            f"  opencode serve processes before the stop {r['before_stop']}, "
            f"left after it {r['left']}",
            flush=True,
        )
    ratio = results["cold"]["elapsed"] / results["warm"]["elapsed"]
    print(f"cold / warm time to answer the crowd: {ratio:.2f}×")
    ok = (
        all(r["left"] == 0 and set(r["statuses"]) == {"succeeded"} for r in results.values())
        and results["warm"]["peak_rss"] <= args.budget_mb * 2**20
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
