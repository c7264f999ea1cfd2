"""The web app in a browser, push vs poll: `scripts/bench web [--runs N] [--idle S]`.

Issue 25: "post → own message visible and post → reply visible in the browser, median
over 20, with the warm engine (aim: own message ≤ 50 ms, reply ≤ 0.5 s on this
machine), and the server's CPU with 20 open rooms idle (push, not poll: near zero)".

- Latency, through the whole chain (a real `crew-server`, the scripted model, a real
  `crew-computer` with the warm engine, OpenCode in bwrap; tests/e2e/chain.py): in
  Debian's chromium (Playwright), signed in through the form, a dm with @ada, whose
  script answers every post with one `crew reply`. Each run submits the composer and
  times in the page (performance.now, a MutationObserver on the timeline) until the
  person's message is in the timeline (the optimistic copy), until the server's copy
  replaced it (what the stream brought), and until @ada's reply is there. The next run
  starts once @ada is idle again. Once with the live streams pushed (the server as
  shipped) and once polled every 0.4 s as before issue 25 (`CREW_WEB_LIVE=poll`, a
  switch kept for this comparison only), one chain each, one after the other.
- Idle CPU: two `crew-server` processes side by side, one pushing, one polling, each
  with 20 tabs open on 20 different rooms (one browser context each: the tabs share
  its SharedWorker's stream), nobody writing. The servers' user+system CPU
  (/proc/<pid>/stat) over the same windows of `--idle` seconds, median of three.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from crew_testkit.crew_server_proc import CrewServer, start_crew_server  # noqa: E402
from tests.e2e.chain import Chain, running_chain  # noqa: E402
from tests.web.conftest import chromium_path  # noqa: E402
from tests.web.pages import DESKTOP, having, heredoc, sign_in  # noqa: E402

MODES = ("push", "poll")
ROOMS = 20
WARMUP = 2
TICKS = os.sysconf("SC_CLK_TCK")

# One post, timed in the page: own (optimistic) copy, server's copy, the agent's reply.
TIME_ONE_POST = """async (marker) => {
  const timeline = document.getElementById("timeline");
  const form = document.querySelector("form[data-composer]");
  const agentsBefore = timeline.querySelectorAll("article.by-agent").length;
  form.querySelector("textarea").value = marker;
  return await new Promise((resolve, reject) => {
    const times = {};
    const start = performance.now();
    const mine = (selector) =>
      [...timeline.querySelectorAll(selector)].some((a) => a.textContent.includes(marker));
    const check = () => {
      const now = performance.now() - start;
      if (times.own === undefined && mine("article.by-user")) times.own = now;
      if (times.server === undefined && mine("article.by-user:not(.pending)")) times.server = now;
      if (times.reply === undefined &&
          timeline.querySelectorAll("article.by-agent").length > agentsBefore) times.reply = now;
      if (times.own !== undefined && times.server !== undefined && times.reply !== undefined) {
        observer.disconnect();
        resolve(times);
      }
    };
    const observer = new MutationObserver(check);
    observer.observe(timeline, { childList: true, subtree: true });
    setTimeout(() => reject(new Error("no reply within 60 s: " + JSON.stringify(times))), 60000);
    form.requestSubmit();
    check();
  });
}"""


@contextlib.contextmanager
def live_mode(mode: str) -> Iterator[None]:
    """Servers started inside run their live streams pushed or polled (`CREW_WEB_LIVE`)."""
    before = os.environ.get("CREW_WEB_LIVE")
    if mode == "poll":
        os.environ["CREW_WEB_LIVE"] = "poll"
    else:
        os.environ.pop("CREW_WEB_LIVE", None)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CREW_WEB_LIVE", None)
        else:
            os.environ["CREW_WEB_LIVE"] = before


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def latencies(browser: Any, mode: str, runs: int) -> dict[str, list[float]]:
    """Post → own copy, → server's copy, → reply (ms) over `runs` posts, in one chain."""
    with live_mode(mode), running_chain(engine_mode="warm") as chain:
        return time_posts(browser, chain, runs)


def time_posts(browser: Any, chain: Chain, runs: int) -> dict[str, list[float]]:
    chain.script(
        [
            {
                "role": "user",
                "match": having("BENCH-"),
                "reply": {"bash": heredoc("{{room}}", "pong")},
            }
        ]
    )
    ada = chain.agent("ada")
    room = chain.dm(ada["id"])
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        sign_in(page, chain.server.url, chain.server.user_token)
        page.goto(f"{chain.server.url}/rooms/{room['id']}")
        found: dict[str, list[float]] = {"own": [], "server": [], "reply": []}
        for n in range(WARMUP + runs):
            times = page.evaluate(TIME_ONE_POST, f"BENCH-{n} hello")
            chain.settled_turns(ada["id"])
            if n >= WARMUP:
                for key in found:
                    found[key].append(float(times[key]))
        return found
    finally:
        context.close()


def open_rooms(browser: Any, server: CrewServer) -> Any:
    """A browser context with 20 tabs, each on its own dm, every tab's stream subscribed."""
    api = server.client()
    rooms = []
    for n in range(ROOMS):
        body = {"handle": f"idle{n}", "name": f"Idle {n}", "model": "local/scripted"}
        agent = api.post("/api/agents", json=body).json()
        room = api.post("/api/rooms", json={"kind": "dm", "agent_ids": [agent["id"]]}).json()
        api.post(f"/api/rooms/{room['id']}/messages", json={"body": f"hello {n}"})
        rooms.append(room["id"])
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    sign_in(page, server.url, server.user_token)
    for room_id in rooms:
        page.goto(f"{server.url}/rooms/{room_id}")
        page = context.new_page()
    page.close()
    return context


def idle_cpu(browser: Any, idle: float) -> dict[str, list[float]]:
    """CPU seconds per `idle` s of a pushing and a polling server, 20 open rooms each."""
    with contextlib.ExitStack() as stack:
        servers = {}
        for mode in MODES:
            with live_mode(mode):
                folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
                servers[mode] = stack.enter_context(start_crew_server(folder))
        for server in servers.values():
            stack.callback(open_rooms(browser, server).close)
        time.sleep(3)  # the tabs' subscriptions and first looks
        found: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(3):
            before = {m: cpu_seconds(s.process.pid) for m, s in servers.items()}
            time.sleep(idle)
            for mode, server in servers.items():
                found[mode].append(cpu_seconds(server.process.pid) - before[mode])
        return found


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench web", description=__doc__)
    parser.add_argument("--runs", type=int, default=20, help="posts per mode (default 20)")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds per CPU window")
    parser.add_argument("--skip-chain", action="store_true", help="only the idle CPU")
    args = parser.parse_args()
    executable = chromium_path()
    if executable is None:
        print("scripts/bench web: no chromium (scripts/setup installs it)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            cpu = idle_cpu(browser, args.idle)
            posts = {} if args.skip_chain else {m: latencies(browser, m, args.runs) for m in MODES}
        finally:
            browser.close()

    print(f"load average: {os.getloadavg()[0]:.2f}")
    if posts:
        print(f"\npost → visible in chromium, warm engine, median of {args.runs} (ms):")
        print(f"  {'':28} {'push':>8} {'poll':>8} {'poll/push':>10}")
        for key, label in (
            ("own", "own message (optimistic)"),
            ("server", "own message (server's copy)"),
            ("reply", "agent's reply"),
        ):
            push, poll = median(posts["push"][key]), median(posts["poll"][key])
            print(f"  {label:28} {push:8.1f} {poll:8.1f} {poll / push:9.2f}×")
    push_cpu, poll_cpu = median(cpu["push"]), median(cpu["poll"])
    print(f"\nserver CPU, {ROOMS} open rooms idle, per {args.idle:g} s (median of 3 windows):")
    print(f"  push {push_cpu * 1000:8.1f} ms ({push_cpu / args.idle * 100:.2f} % of a core)")
    print(f"  poll {poll_cpu * 1000:8.1f} ms ({poll_cpu / args.idle * 100:.2f} % of a core)")
    ratio = poll_cpu / push_cpu if push_cpu else float("inf")
    print(f"  poll/push {ratio:.1f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
