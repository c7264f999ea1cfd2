"""The web app opens a long room as fast as a short one: `scripts/bench timeline [--repeat N]`.

A real `crew-server` subprocess with a file database holding a dm of 100 messages and
a dm of 10,000. A browser session (signed in through the form, as a person would)
opens each room page (`GET /rooms/{id}`: the newest page of the timeline, the rooms
with their unread counts, the room's tasks) N times, alternating; the medians are
printed side by side. The timeline is paged (50 messages a page), so the target is
that the 10,000-message room opens in under 2× the time of the 100-message one.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crew_server.clock import Clock
from crew_server.store import Store
from crew_testkit.crew_server_proc import start_crew_server

SIZES = (100, 10_000)
TARGET_RATIO = 2.0


def seed(db: Path) -> dict[int, str]:
    """One agent and, per size, a dm with that many messages: size → room id."""
    store = Store(str(db), Clock())
    rooms = {}
    for size in SIZES:
        # A dm is one per agent: each size gets its own agent.
        owner = store.create_agent(f"bench{size}", "Bench", "", "local/scripted", "opencode", None)
        room, _ = store.create_room("dm", None, [owner["id"]])
        for i in range(size):
            store.user_post(
                room["id"], f"message {i} of {size}, @bench{size} with some words", None
            )
        rooms[size] = room["id"]
    store.close()
    return rooms


def signed_in(url: str, token: str) -> httpx.Client:
    """A client holding a web session, signed in through the form."""
    client = httpx.Client(base_url=url, timeout=30)
    form = client.get("/login").text
    found = re.search(r'name="sign_in" value="([^"]+)"', form)
    assert found, "no sign-in form"
    answer = client.post("/login", data={"sign_in": found.group(1), "token": token})
    if answer.status_code != 303:
        raise RuntimeError(f"sign-in failed: {answer.status_code} {answer.text[:200]}")
    return client


def main() -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench timeline", description=__doc__)
    parser.add_argument("--repeat", type=int, default=30, help="page loads per room (default 30)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="crew-bench-timeline-") as tmp:
        root = Path(tmp)
        with start_crew_server(root) as server:  # first start: the user token
            token = server.user_token
        started = time.perf_counter()
        rooms = seed(root / "crew.db")
        print(
            f"seeded rooms of {' and '.join(map(str, SIZES))} messages in "
            f"{time.perf_counter() - started:.1f} s"
        )
        with start_crew_server(root) as server:
            browser = signed_in(server.url, token)
            times: dict[int, list[float]] = {size: [] for size in SIZES}
            for size in SIZES:  # warm up
                browser.get(f"/rooms/{rooms[size]}").raise_for_status()
            for _ in range(args.repeat):
                for size in SIZES:
                    start = time.perf_counter()
                    page = browser.get(f"/rooms/{rooms[size]}")
                    times[size].append(time.perf_counter() - start)
                    page.raise_for_status()
                    if f"message {size - 1} of {size}" not in page.text:
                        raise RuntimeError(
                            f"the {size}-message room did not show its newest message"
                        )
    medians = {size: statistics.median(times[size]) for size in SIZES}
    for size in SIZES:
        print(f"  room of {size:>6} messages: median {medians[size] * 1000:7.2f} ms per page")
    ratio = medians[SIZES[1]] / medians[SIZES[0]]
    verdict = "ok" if ratio < TARGET_RATIO else "OVER TARGET"
    print(f"  ratio {ratio:.2f}× (target < {TARGET_RATIO:.0f}×): {verdict}")
    return 0 if ratio < TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
