"""`scripts/bench prewarm`: the first reply after an idle stop, with and without the hint.

The real OpenCode on its warm server in the real sandbox, the scripted model, the
real crew-server and crew-computer (`crew_harness.demo.local_stack`), one agent in a
dm, the warm engine with a short idle timeout (`IDLE_S`) so its server is stopped
between runs as it is after ten idle minutes in life. Each run waits until the
agent's server is gone (`/agents`: not warm), then, alternating:

- with hint: the person opens the dm in the web app (signed in with the user
  token; `GET /rooms/{id}` sends the `prewarm` hint) and types until the prewarm is
  done (`crew_prewarm_starts_total`: the server started), then sends: the reply a person gets who typed long enough. How
  long that took (hint → warm) is printed: a person who types less waits the rest.
  `--typing S` types for a fixed S seconds instead;
- without: the message is sent with no page opened (the server starts for it);
- warm again: right after that turn, another one on the same, used server (the
  floor a prewarm could reach on this machine now).

Timed from the post (user API) until the Computer's `/events` says the turn is
finished (its reply was stored just before; no polling during the turn). The
server rate limits hints per agent (30 s), so a hinted run waits until the last
hint is that old. How each turn found its server comes from `/metrics`
(`crew_warm_turn_server_total`): warm, starting (the prewarm still under way)
or none. Aim (issue 26): with the hint ≤ 0.35 s on this 2-core machine.

Usage: scripts/bench prewarm [--runs N] [--typing S]   (N ≥ 1 per series, default 5)
Everything runs on this machine: on a loaded one (see the load average printed)
the server's start, and so the "without" series, grows most.
`benchmarks/turn.py --engine warm` prints the same line (`first_reply_line`).
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crew_harness.demo import LocalStack, local_stack
from crew_harness.scripted_model import Script
from crew_harness.waiting import wait_until

MODEL = "local/scripted"
IDLE_S = 4
HINT_EVERY_S = 30.0  # crew_server.api.stream.PREWARM_EVERY_S
BODY = "Please say ok."


class Finishes:
    """The Computer's `/events` stream: the time of each `turn` event (a finish recorded)."""

    def __init__(self, stack: LocalStack) -> None:
        self._socket = str(stack.computer.socket)
        self._times: queue.Queue[float] = queue.Queue()
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        transport = httpx.HTTPTransport(uds=self._socket)
        with (
            httpx.Client(transport=transport, base_url="http://computer", timeout=None) as local,
            local.stream("GET", "/events") as response,
        ):
            kind = None
            for line in response.iter_lines():
                if line.startswith("event:"):
                    kind = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and kind == "turn":
                    self._times.put(time.perf_counter())

    def drain(self) -> None:
        while not self._times.empty():
            self._times.get_nowait()

    def next(self, timeout: float) -> float:
        try:
            return self._times.get(timeout=timeout)
        except queue.Empty:
            raise SystemExit(f"a turn did not finish within {timeout:.0f} s") from None


def signed_in_browser(stack: LocalStack) -> httpx.Client:
    """A browser-like client signed in to the web app with the user token."""
    browser = httpx.Client(base_url=stack.server.url, timeout=10)
    form = browser.get("/login").text
    found = re.search(r'name="sign_in" value="([^"]*)"', form)
    if not found:
        raise SystemExit("the sign-in form has no sign_in field")
    token = stack.http.headers["Authorization"].removeprefix("Bearer ")
    answer = browser.post("/login", data={"sign_in": found.group(1), "token": token})
    if answer.status_code != 303:
        raise SystemExit(f"signing in failed: {answer.status_code} {answer.text[:200]}")
    return browser


def agent_warm(stack: LocalStack, agent_id: str) -> bool:
    with stack.computer.introspection() as local:
        row: dict[str, Any] = local.get(f"/agents/{agent_id}").json()
    return bool((row.get("engine") or {}).get("warm"))


def metric_lines(stack: LocalStack) -> list[str]:
    with stack.computer.introspection() as local:
        return local.get("/metrics").text.splitlines()


def prewarms_done(stack: LocalStack) -> float:
    """`crew_prewarm_starts_total`: counted once a prewarmed server has started."""
    name = "crew_prewarm_starts_total "
    return sum(float(line[len(name) :]) for line in metric_lines(stack) if line.startswith(name))


def found_counts(stack: LocalStack) -> dict[str, float]:
    text = "\n".join(metric_lines(stack))
    counts = {}
    for how in ("warm", "starting", "none"):
        name = f'crew_warm_turn_server_total{{found="{how}"}} '
        counts[how] = sum(
            float(line[len(name) :]) for line in text.splitlines() if line.startswith(name)
        )
    return counts


def first_replies(runs: int, typing_s: float | None = None) -> dict[str, Any]:
    """Both series (module doc) → their times and how their turns found the server."""
    times: dict[str, list[float]] = {"with hint": [], "without": [], "warm again": []}
    found: dict[str, dict[str, float]] = {k: {"warm": 0, "starting": 0, "none": 0} for k in times}
    to_warm: list[float] = []
    script = Script.parse({"rules": []})
    with local_stack(
        script=script,
        price_in_config=True,
        engine_mode="warm",
        bootstrap_extra={"warm_idle_timeout_s": IDLE_S},
    ) as stack:
        if not stack.health["sandbox"]["ok"]:
            raise SystemExit(f"the sandbox is not usable: {stack.health['sandbox']['reason']}")
        agent = stack.create_agent("early", "Early", "Answers every message.", MODEL)
        room = stack.call("POST", "/api/rooms", json={"kind": "dm", "agent_ids": [agent["id"]]})
        finishes = Finishes(stack)
        browser = signed_in_browser(stack)
        time.sleep(0.3)  # the stream is open

        def turn() -> float:
            finishes.drain()
            started = time.perf_counter()
            stack.call("POST", f"/api/rooms/{room['id']}/messages", json={"body": BODY})
            return finishes.next(180) - started

        turn()  # the session and OpenCode's database exist from here on, as in life
        last_hint = -HINT_EVERY_S
        for i in range(2 * runs):
            series = "with hint" if i % 2 == 0 else "without"
            wait_until("the idle stop", lambda: not agent_warm(stack, agent["id"]), 60)
            if series == "with hint":
                time.sleep(max(0.0, last_hint + HINT_EVERY_S + 0.5 - time.monotonic()))
                last_hint = time.monotonic()
                done = prewarms_done(stack)
                if browser.get(f"/rooms/{room['id']}").status_code != 200:
                    raise SystemExit("the room page did not open")
                if typing_s is not None:
                    time.sleep(typing_s)
                else:
                    wait_until("the prewarm", lambda d=done: prewarms_done(stack) > d, 120)
                    to_warm.append(time.monotonic() - last_hint)
            before = found_counts(stack)
            times[series].append(turn())
            after = found_counts(stack)
            for how in after:
                found[series][how] += after[how] - before[how]
            print(f"  run {i // 2 + 1}/{runs} {series}: {times[series][-1]:.3f} s", flush=True)
            if series == "without":
                before = found_counts(stack)
                times["warm again"].append(turn())
                after = found_counts(stack)
                for how in after:
                    found["warm again"][how] += after[how] - before[how]
        browser.close()
        model_calls = len(stack.model.requests("all")) if stack.model is not None else 0
        listed = stack.call("GET", "/api/turns", params={"agent_id": agent["id"]})
        if any(t["status"] != "succeeded" for t in listed):
            raise SystemExit(f"not every turn succeeded: {[t['status'] for t in listed]}")
    print(f"  model calls {model_calls} for {len(listed)} turns (a prewarm makes none)")
    return {"times": times, "found": found, "typing_s": typing_s, "to_warm": to_warm}


def first_reply_line(result: dict[str, Any]) -> str:
    """The line `turn.py --engine warm` prints too."""
    med = {k: statistics.median(v) for k, v in result["times"].items()}
    ratio = med["without"] / med["with hint"] if med["with hint"] else float("nan")
    typing = result["typing_s"]
    hint = (
        f"the hint {typing:g} s before the post"
        if typing is not None
        else f"posted once warm: hint → warm median {statistics.median(result['to_warm']):.2f} s"
    )
    return (
        f"first reply after idle stop: with hint {med['with hint']:.3f} s, "
        f"without {med['without']:.3f} s  ({ratio:.1f}x; medians, post → turn finished; {hint}; "
        f"a warm server's next turn {med['warm again']:.3f} s)"
    )


def report(result: dict[str, Any]) -> None:
    print()
    print(first_reply_line(result))
    for series, values in result["times"].items():
        how = ", ".join(f"{k} {v:.0f}" for k, v in result["found"][series].items())
        print(
            f"  {series:<10} median {statistics.median(values):.3f} s  min {min(values):.3f}  "
            f"max {max(values):.3f}  (n={len(values)}; server found: {how})"
        )
    print(f"  load average (1 min) {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per series (default 5)")
    parser.add_argument(
        "--typing", type=float, default=None, help="hint → post, seconds (default: until warm)"
    )
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    report(first_replies(args.runs, args.typing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
