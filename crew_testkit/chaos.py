"""The chaos run (issue 22): the storm with every fault a machine meets, counted from the database.

A `Storm` (crew_testkit/storm.py: the real server and Computer, the fake engine,
concurrent posters) whose fault injector also pauses processes and kills them
outright, and restarts what it killed as a supervisor (systemd, launchd) would:

- `computer` / `computer_stop`: kill -9 of `crew-computer` (a new one on the same
  crew home) / SIGSTOP for a while, then SIGCONT;
- `launcher` / `launcher_stop`: the same for the sandbox launcher (the Computer
  starts a new launcher itself);
- `server` (SIGTERM and back), `server_kill` (kill -9 and back on its port and
  database), `server_stop` (SIGSTOP, then SIGCONT);
- `warm_kill` / `warm_stop`: an agent's warm `opencode serve` (the fake one);
- `disk`: the database's tmpfs full for a while, then freed (root only).

A pause lasts `stop_s` seconds drawn from the seed: some under `crew`'s 10 s
limit, some over it (the paused-server case of the issue). At the end
`crew_testkit.answer_ledger` reads the database: once, twice, lost, set aside,
stuck turns.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from crew_harness.waiting import wait_until
from crew_testkit.crew_server_proc import start_crew_server
from crew_testkit.storm import (
    FAULT_KINDS,
    FaultRecord,
    Storm,
    StormPlan,
    StormResult,
    launcher_pids,
    run_storm,
)

CHAOS_KINDS = (
    *FAULT_KINDS,
    "computer_stop",
    "launcher_stop",
    "server_kill",
    "server_stop",
    "warm_kill",
    "warm_stop",
)
# The default mix: every kind (a kill -9 of the Computer included).
DEFAULT_FAULTS = CHAOS_KINDS


@dataclass(frozen=True)
class Size:
    """How big a chaos run is."""

    messages: int
    agents: int
    clients: int
    rate: float
    fault_every_s: float


SIZES = {
    "small": Size(messages=40, agents=3, clients=2, rate=4.0, fault_every_s=3.0),
    "medium": Size(messages=200, agents=5, clients=4, rate=6.0, fault_every_s=4.0),
    "large": Size(messages=600, agents=8, clients=6, rate=8.0, fault_every_s=4.0),
}


def chaos_plan(
    seed: int, size: str = "medium", faults: tuple[str, ...] = DEFAULT_FAULTS
) -> StormPlan:
    """The storm plan of a chaos run of `size` (warm engine: a warm server to strike)."""
    chosen = SIZES[size]
    return StormPlan(
        messages=chosen.messages,
        agents=chosen.agents,
        seed=seed,
        faults=faults,
        rate=chosen.rate,
        fault_every_s=chosen.fault_every_s,
        clients=chosen.clients,
        engine_mode="warm",
        think_s=0.3,
        linger_s=0.3,
        disk_window_s=2.0,
        quiet_timeout_s=180.0,
    )


def descendants(root: int) -> list[int]:
    """Every process below `root` (by parent pid), nearest first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def warm_server_pids(computer_pid: int) -> list[int]:
    """The warm `opencode serve` processes running under the Computer (the fake one).

    Their argv is `… serve --pure --print-logs --port …` (sandbox_launcher/warm_server.py);
    the wrappers above them (bwrap, setpriv) carry the same words after their own, so
    only the innermost of each chain is taken.
    """
    found = []
    for pid in descendants(computer_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and b"--pure" in argv and b"--print-logs" in argv:
            found.append(pid)
    inner = set(found)
    return [pid for pid in found if not inner.intersection(descendants(pid))]


class Chaos(Storm):
    """A storm that also pauses and kills outright, and restarts as a supervisor does."""

    KINDS = CHAOS_KINDS

    def _pause(self, pid: int, record: FaultRecord, what: str) -> None:
        """SIGSTOP `pid` for a while drawn from the seed, then SIGCONT."""
        rng = random.Random(f"stop-{self.plan.seed}-{len(self.faults)}")
        seconds = rng.choice((rng.uniform(1.0, 6.0), rng.uniform(11.0, 16.0)))
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            # A stopped warm server may be killed meanwhile (its launcher's restart).
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        record.note = f"SIGSTOP of {what} {pid} for {seconds:.1f} s"

    def _fault_computer_stop(self, record: FaultRecord) -> None:
        self._pause(self.computer.proc.pid, record, "crew-computer")

    def _fault_launcher_stop(self, record: FaultRecord) -> None:
        parent = self.computer.proc.pid
        [pid, *_] = wait_until("a sandbox launcher", lambda: launcher_pids(parent), 30)
        self._pause(pid, record, "the launcher")

    def _fault_server_stop(self, record: FaultRecord) -> None:
        self._pause(self.server.process.pid, record, "crew-server")

    def _fault_server_kill(self, record: FaultRecord) -> None:
        port = int(self.server.url.rsplit(":", 1)[1])
        old = self.server.process
        old.kill()
        old.wait(timeout=10)
        self.server.stop()  # closes its client
        # The supervisor restarts it at once, on the same port and database.
        self.server = start_crew_server(self._server_dir, db=self.server.db, port=port)
        record.note = f"kill -9 of crew-server {old.pid}, started again on port {port}"

    def _warm_server(self) -> int | None:
        """One of the warm servers running (waiting a little: after a launcher's kill
        they start again with the next turns), or None."""
        rng = random.Random(f"warm-{self.plan.seed}-{len(self.faults)}")
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            pids = warm_server_pids(self.computer.proc.pid)
            if pids:
                return rng.choice(pids)
            time.sleep(0.2)
        return None

    def _fault_warm_kill(self, record: FaultRecord) -> None:
        pid = self._warm_server()
        if pid is None:
            record.note = "no warm server running: nothing to kill"
            return
        os.kill(pid, signal.SIGKILL)
        record.note = f"kill -9 of warm server {pid}"

    def _fault_warm_stop(self, record: FaultRecord) -> None:
        pid = self._warm_server()
        if pid is None:
            record.note = "no warm server running: nothing to stop"
            return
        self._pause(pid, record, "warm server")


def run_chaos(
    plan: StormPlan, say: Callable[[str], None] = print, keep: Path | None = None
) -> StormResult:
    """One chaos run from start to end (`run_storm` with the chaos faults)."""
    return run_storm(plan, say=say, keep_on_loss=keep, storm_class=Chaos)
