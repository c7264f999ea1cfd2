"""The whole chain with the real OpenCode for the fault tests of issue 22, in either engine.

As tests/e2e/chain.py (`Chain`: crew-server, the scripted model, a real
crew-computer running the real `opencode` in bwrap, warm or cold), but built for
faults: the Computer can be killed (-9) and started again on the same crew home,
the server's database can live where the test wants it (a small tmpfs, a
PostgreSQL database shared by two server processes), and the Computer (and the
`crew` of its sandboxes) can talk to the server through a `ForwardingProxy`.
`answered_once` counts from the database (crew_testkit/answer_ledger.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from crew_harness.demo import ComputerProcess, start_computer, user_env, write_scripted_login
from crew_harness.scripted_model import ROOM_ID, Script, ScriptedModel
from crew_harness.waiting import wait_until
from crew_testkit.answer_ledger import Ledger, read_ledger
from crew_testkit.computer_proc import launcher_pids
from crew_testkit.crew_server_proc import CrewServer, start_crew_server
from tests.e2e.chain import Chain
from tests.e2e.opencode_by_hand import OPENCODE
from tests.faults.forwarding_proxy import ForwardingProxy
from tests.support.ci import required_in_ci

ENGINE_MODES = ["warm", "cold"]
START_TIMEOUT_S = 60.0


def reply_rule(tag: str, body: str, then: str = "") -> dict[str, Any]:
    """A model rule: a turn whose input holds `tag` runs `crew reply <its room>` with
    `body` (every such turn: the harshest model, which never remembers), then `then`."""
    reply = f"crew reply {{{{room}}}} <<'EOF'\n{body}\nEOF"
    return {
        "role": "user",
        "match": rf"(?=.*{tag}).*Reply with: crew reply (?P<room>{ROOM_ID})",
        "reply": {"bash": reply + (f"\n{then}" if then else "")},
    }


def once_in_work_dir(marker: str, command: str) -> str:
    """Shell that runs `command` only the first time in the agent's work dir."""
    return f"if [ ! -e {marker} ]; then touch {marker}; {command}; fi"


@dataclass
class FaultChain:
    """The chain and what a fault test does to it."""

    chain: Chain
    env: dict[str, str]
    bootstrap: dict[str, Any]
    servers: list[CrewServer]
    db: Path | str
    proxy: ForwardingProxy | None = None
    computers: list[ComputerProcess] = field(default_factory=list)

    @property
    def computer(self) -> ComputerProcess:
        return self.chain.computer

    def agent_replies(self, room_id: str) -> list[str]:
        return [m["body"] for m in self.chain.messages(room_id) if m["author"]["kind"] == "agent"]

    def work_dir(self, agent_id: str) -> Path:
        return self.chain.crew_home / "agents" / agent_id / "work"

    def kill_computer(self) -> None:
        """kill -9 of crew-computer (its ack and finish never go out)."""
        self.computer.proc.kill()
        self.computer.proc.wait(timeout=10)

    def kill_launcher(self) -> None:
        """kill -9 of the Computer's sandbox launcher."""
        [pid] = launcher_pids(self.computer.proc.pid)
        os.kill(pid, signal.SIGKILL)

    def relaunch(self) -> None:
        """A new crew-computer on the same crew home and bootstrap, as a supervisor does."""
        logs = self.chain.root / f"computer-{len(self.computers)}"
        logs.mkdir()
        computer = start_computer(self.env, self.bootstrap, self.chain.crew_home, logs)
        self.computers.append(computer)
        self.chain.computer = computer
        wait_until("the Computer's launcher health", computer.health, START_TIMEOUT_S)

    def at_rest(self, timeout: float = 120.0) -> Ledger:
        """The database's count once every message is read and no turn runs."""

        def rested() -> Ledger | None:
            ledger = read_ledger(self.db)
            return ledger if ledger.at_rest else None

        return wait_until("every message read and no turn running", rested, timeout)

    def answered_once(self, messages: int, timeout: float = 120.0) -> Ledger:
        """Assert, from the database at rest, `messages` messages each answered exactly once."""
        ledger = self.at_rest(timeout)
        verdicts = [f.verdict for f in ledger.fates]
        assert verdicts == ["once"] * messages, (
            f"{ledger.summary()}\n{ledger.details()}\n{self.chain.diagnostics()}"
        )
        return ledger


@contextlib.contextmanager
def fault_chain(
    engine_mode: str,
    *,
    db: Path | str | None = None,
    servers: int = 1,
    through_proxy: bool = False,
    **bootstrap_extra: Any,
) -> Iterator[FaultChain]:
    """Start the chain in a fresh short temp dir; everything stops at the end.

    `db`: the server's database (default: a SQLite file in the temp dir); with
    `servers=2` (a PostgreSQL URL) a second server shares it, and the user's calls
    go to that one. `through_proxy`: the Computer's `server_url` is a
    `ForwardingProxy` in front of the first server.
    """
    if not OPENCODE.exists():
        required_in_ci("OpenCode (scripts/setup installs it into tools/opencode)")
    if shutil.which("bwrap") is None:
        required_in_ci("bubblewrap (apt-get install bubblewrap)")
    root = Path(tempfile.mkdtemp(prefix="crew-f-"))
    home, crew_home = root / "home", root / "crew"
    home.mkdir()
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        model = stack.enter_context(ScriptedModel(Script()))
        started = [stack.enter_context(start_crew_server(root / "server", db=db))]
        for _ in range(servers - 1):
            started.append(stack.enter_context(start_crew_server(root / "server", db=db)))
        first = started[0]
        write_scripted_login(home, model.base_url, price_in_config=True)
        http = stack.enter_context(
            httpx.Client(base_url=started[-1].url, timeout=10, headers=first.user_headers)
        )
        proxy = None
        if through_proxy:
            proxy = ForwardingProxy(int(first.url.rsplit(":", 1)[1]))
            stack.callback(proxy.close)
        created = first.create_computer("faults")
        bootstrap = {
            "server_url": proxy.url if proxy else first.url,
            "token": created["token"],
            "crew_home": str(crew_home),
            "opencode_path": str(OPENCODE),
            "engine_mode": engine_mode,
            **bootstrap_extra,
        }
        env = user_env(home, crew_home)
        computer = start_computer(env, bootstrap, crew_home, root)
        chain = Chain(root, first, model, computer, created["computer_id"], http, engine_mode)
        faults = FaultChain(chain, env, bootstrap, started, first.db, proxy, [computer])
        stack.callback(_stop_all, faults)
        health = wait_until("the Computer's launcher health", computer.health, START_TIMEOUT_S)
        if not health["sandbox"]["ok"]:
            pytest.fail(f"the sandbox is not usable here: {health['sandbox']['reason']}")
        yield faults


def _stop_all(faults: FaultChain) -> None:
    for computer in faults.computers:
        code = computer.stop()
        if code not in (0, -signal.SIGKILL):
            print(f"crew-computer exited {code}; stderr:\n{computer.stderr()[-3000:]}")
