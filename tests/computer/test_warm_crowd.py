"""Warm servers in a crowd: 200 agents woken at once on a small memory budget.

The real Computer, launcher, bwrap and pasta; the fake engine's `serve` as each
agent's warm server (crew_testkit/fake_opencode.py: a turn runs as a process
of the server's sandbox). While the crowd's turns run, the Computer's `/health`
is sampled and the host's processes counted: the turn cap and the memory
budget hold, idle servers are evicted to make room, every message is
answered, and after shutdown no server is left. Turns that find no room run
cold, so the cap is held over both engines' turns at once (the runners alone,
in-process: tests/computer/test_runner.py).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import ComputerProc, bootstrap_for, launch, machine
from crew_testkit.crowd import CROWD_TOOL, peak_overlap, tool_spans
from tests.launcher.helpers import processes_with
from tests.support.computer import need_sandbox, usable
from tests.support.turns import finished

pytestmark = pytest.mark.timeout(600)

AGENTS = int(os.environ.get("CREW_TEST_CROWD", "200"))  # fewer only for a quick local look
CAP = 4
# The pool reserves 650 MB (a real server's size) for each server it is starting: two can
# start at once; the fake servers (~25 MB each) then fill the rest until idle ones are evicted.
BUDGET_MB = 1500


def _metric(text: str, name: str) -> float:
    """The value of an unlabelled `/metrics` sample."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics:\n{text[:2000]}")


class HealthSamples:
    """`/health`'s warm part, read every 50 ms in a thread until stopped."""

    def __init__(self, computer: ComputerProc) -> None:
        self.computer = computer
        self.samples: list[dict[str, Any]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.wait(0.05):
            try:
                self.samples.append(self.computer.get("/health")["warm"])
            except (httpx.HTTPError, AssertionError):  # a busy socket misses one sample
                continue

    def __enter__(self) -> HealthSamples:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()


def _servers_of(crew_home: Path) -> list[int]:
    """Fake `opencode serve` processes on the host that belong to this Computer."""
    found = []
    for pid in processes_with("fake_opencode.py"):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        args = cmdline.split(b"\0")
        # The server itself (`[python3] fake_opencode.py serve …`), not bwrap's argv naming it
        script = 1 if args[0].rsplit(b"/", 1)[-1].startswith(b"python") else 0
        if (
            args[script].endswith(b"fake_opencode.py")
            and args[script + 1 : script + 2] == [b"serve"]
            and str(crew_home).encode() in environ
        ):
            found.append(pid)
    return found


def test_two_hundred_agents_at_once_on_a_small_memory_budget(crew_server: Any) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agents = [
            crew_server.create_agent(f"warmcrowd{n}", computer_id=comp["computer_id"])
            for n in range(AGENTS)
        ]
        groups = [
            crew_server.create_room("group", [a["id"] for a in agents[g : g + 10]], f"w{g}")
            for g in range(0, AGENTS, 10)
        ]
        bootstrap = bootstrap_for(
            crew_server.url,
            comp["token"],
            m,
            engine_mode="warm",
            warm_memory_mb=BUDGET_MB,
            max_concurrent_turns=CAP,
        )
        c = launch(m, bootstrap)
        stopped = False
        try:
            usable(c)
            wait_until(f"{AGENTS} runners", lambda: len(c.get("/agents")) == AGENTS, 120)
            with HealthSamples(c) as health:
                for group in groups:
                    crew_server.post(
                        group["id"],
                        f"everyone:\n{CROWD_TOOL}\nthanks",
                    )
                for agent in agents:
                    [turn] = finished(crew_server, agent["id"], 1, timeout=400)
                    assert turn["status"] == "succeeded", (turn.get("failure"), c.stderr()[-2000:])
            with c.local() as local:
                metrics = local.get("/metrics").text

            # The cap: no instant is inside more than CAP of the turns' tool runs.
            peak = peak_overlap(tool_spans(m.crew_home, [a["id"] for a in agents]))
            assert 1 <= peak <= CAP, peak

            # The budget: the servers' measured memory never went over it, so idle
            # servers were evicted.
            budget = BUDGET_MB * 1024 * 1024
            assert all(s["memory_budget_bytes"] == budget for s in health.samples)
            assert max(s["rss_bytes"] for s in health.samples) <= budget, max(
                health.samples, key=lambda s: s["rss_bytes"]
            )
            assert max(s["servers"] for s in health.samples) >= 2, health.samples
            warm = _metric(metrics, "crew_warm_turns_total")
            cold = _metric(metrics, "crew_cold_turns_total")
            assert warm + cold == AGENTS, (warm, cold)
            # Only two servers can be starting at once within the budget; the cap lets
            # four turns run: some ran cold, and the warm ones needed evictions.
            assert warm >= AGENTS // 4 and cold >= 1, (warm, cold)
            starts = _metric(metrics, "crew_warm_starts_total")
            assert _metric(metrics, "crew_warm_evictions_total") >= starts - 10, metrics

            assert _servers_of(m.crew_home), "the idle servers should still run before the stop"
            code = c.stop()
            stopped = True
            assert code == 0, c.stderr()[-3000:]
            # Nothing of any server outlives the Computer.
            assert not _servers_of(m.crew_home)
        finally:
            if not stopped:
                c.stop()


def test_a_server_a_turn_left_over_its_ceiling_is_restarted_before_the_next_turn(
    crew_server: Any,
) -> None:
    need_sandbox()
    with machine() as m:
        m.log_in()
        comp = crew_server.create_computer()
        agent = crew_server.create_agent("warmgrow", computer_id=comp["computer_id"])
        dm = crew_server.create_room("dm", [agent["id"]])
        bootstrap = bootstrap_for(
            crew_server.url, comp["token"], m, engine_mode="warm", warm_server_max_mb=96
        )
        c = launch(m, bootstrap)
        try:
            usable(c)
            crew_server.post(dm["id"], "hello")
            [first] = finished(crew_server, agent["id"], 1)
            [before] = _servers_of(m.crew_home)
            crew_server.post(dm["id"], "eat:\nFAKE:GROW 160")  # the server itself grows
            _, grown = finished(crew_server, agent["id"], 2)
            assert first["status"] == grown["status"] == "succeeded", grown
            wait_until("the grown server to be gone", lambda: not _servers_of(m.crew_home), 10)
            assert c.get("/agents")[0]["engine"]["warm"] is False
            crew_server.post(dm["id"], "and now?")
            *_, third = finished(crew_server, agent["id"], 3)
            assert third["status"] == "succeeded", third
            [after] = _servers_of(m.crew_home)
            assert after != before
            with c.local() as local:
                metrics = local.get("/metrics").text
            assert _metric(metrics, "crew_warm_ceiling_restarts_total") == 1
            assert _metric(metrics, "crew_warm_starts_total") == 2
            assert _metric(metrics, "crew_warm_turns_total") == 3
        finally:
            assert c.stop() == 0, c.stderr()[-3000:]
