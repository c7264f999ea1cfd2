"""The whole chain as processes: crew-server, the scripted model, crew-computer.

A real `crew-server --dev` subprocess, the scripted model in a thread, and a
real `crew-computer` subprocess (which starts the launcher, which runs the real
`opencode` in bwrap). The Computer's HOME is temporary; the user's OpenCode
login and provider config are written there, as a user's would be. The
`chain` fixture (conftest.py) starts one per test module and engine mode
(start-up costs seconds): every whole-chain test runs once with the warm engine
(one `opencode serve` per agent) and once with the cold one (one `opencode run`
per turn), and after each test `Chain.check_engine` proves from the Computer's
`/metrics`, `/health` and `/agents` that the turns ran in that mode — a warm
Computer that silently fell back to cold turns fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from crew_harness.demo import (
    ComputerProcess,
    DemoError,
    start_computer,
    user_env,
    write_scripted_login,
)
from crew_harness.scripted_model import Script, ScriptedModel
from crew_harness.waiting import wait_until
from crew_testkit.crew_server_proc import CrewServer, start_crew_server
from tests.e2e.opencode_by_hand import OPENCODE
from tests.support.ci import required_in_ci

MODEL = "local/scripted"
START_TIMEOUT_S = 30.0
ENGINE_MODES = ["warm", "cold"]


@dataclass
class Chain:
    """The whole system on this machine, with helpers speaking the user API."""

    root: Path
    server: CrewServer
    model: ScriptedModel
    computer: ComputerProcess
    computer_id: str
    http: httpx.Client
    engine_mode: str
    handles: dict[str, str] = field(default_factory=dict)

    @property
    def crew_home(self) -> Path:
        return self.computer.crew_home

    def script(self, rules: list[dict[str, Any]]) -> None:
        """Replace the model's script (request numbers start again at 1)."""
        self.model.set_script(Script.parse({"rules": rules}))

    def expect_ok(self, response: httpx.Response) -> Any:
        """The JSON of a user-API answer that must be a success."""
        assert response.status_code < 300, (
            f"{response.request.url}: {response.status_code} {response.text}"
        )
        return response.json() if response.content else None

    def agent(
        self,
        handle: str,
        name: str | None = None,
        persona: str = "Helpful.",
        permission: dict[str, Any] | None = None,
        capabilities: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A new agent on this Computer. A `permission` policy and `capabilities` (its MCP
        servers and skills, `crew_common.capabilities`) go in the create call, never a
        change after: the Computer then learns the agent with them, so the first turn
        already runs with them."""
        body: dict[str, Any] = {
            "handle": handle,
            "name": name or handle.title(),
            "persona": persona,
            "model": MODEL,
            "computer_id": self.computer_id,
        }
        if permission is not None:
            body["permission"] = permission
        if capabilities is not None:
            body["capabilities"] = capabilities
        agent: dict[str, Any] = self.expect_ok(self.http.post("/api/agents", json=body))
        self.handles[agent["id"]] = handle
        return agent

    def capabilities(self, agent_id: str) -> dict[str, Any]:
        """The agent's capabilities as the user sees them (secrets read "(set)")."""
        document: dict[str, Any] = self.expect_ok(
            self.http.get(f"/api/agents/{agent_id}/capabilities")
        )
        return document

    def set_capabilities(self, agent_id: str, document: dict[str, Any]) -> dict[str, Any]:
        """Replace the agent's capabilities (its Computer re-syncs it)."""
        saved: dict[str, Any] = self.expect_ok(
            self.http.put(f"/api/agents/{agent_id}/capabilities", json=document)
        )
        return saved

    def dm(self, agent_id: str) -> dict[str, Any]:
        room: dict[str, Any] = self.expect_ok(
            self.http.post("/api/rooms", json={"kind": "dm", "agent_ids": [agent_id]})
        )
        return room

    def group(self, title: str, agent_ids: list[str]) -> dict[str, Any]:
        room: dict[str, Any] = self.expect_ok(
            self.http.post(
                "/api/rooms", json={"kind": "group", "title": title, "agent_ids": agent_ids}
            )
        )
        return room

    def post(self, room_id: str, body: str, thread_of: str | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = {"body": body}
        if thread_of:
            payload["thread_of"] = thread_of
        message: dict[str, Any] = self.expect_ok(
            self.http.post(f"/api/rooms/{room_id}/messages", json=payload)
        )
        return message

    def messages(self, room_id: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.expect_ok(self.http.get(f"/api/rooms/{room_id}/messages"))
        return rows

    def turns(self, agent_id: str) -> list[dict[str, Any]]:
        """The agent's turns, oldest first."""
        rows: list[dict[str, Any]] = self.expect_ok(
            self.http.get("/api/turns", params={"agent_id": agent_id})
        )
        return list(reversed(rows))

    def turn(self, turn_id: str) -> dict[str, Any]:
        row: dict[str, Any] = self.expect_ok(self.http.get(f"/api/turns/{turn_id}"))
        return row

    def finished_turns(
        self, agent_id: str, count: int, timeout: float = 90
    ) -> list[dict[str, Any]]:
        """Wait until the agent has `count` turns that are no longer running; full records."""

        def probe() -> list[dict[str, Any]] | None:
            done = [t for t in self.turns(agent_id) if t["status"] != "running"]
            return done if len(done) >= count else None

        done = wait_until(
            f"{count} finished turn(s) of @{self.handles.get(agent_id)}", probe, timeout
        )
        return [self.turn(t["id"]) for t in done]

    def settled_turns(self, agent_id: str, timeout: float = 90) -> list[dict[str, Any]]:
        """Wait until the agent is idle with no pending wake and no running turn; its turns."""

        def probe() -> list[dict[str, Any]] | None:
            with self.computer.introspection() as local:
                row = local.get(f"/agents/{agent_id}").json()
            if row.get("state") != "idle" or row.get("pending_wake"):
                return None
            turns = self.turns(agent_id)
            return turns if all(t["status"] != "running" for t in turns) else None

        return wait_until(f"@{self.handles.get(agent_id)} to settle", probe, timeout)

    def agent_messages(self, room_id: str, agent_id: str) -> list[dict[str, Any]]:
        return [m for m in self.messages(room_id) if m["author"]["id"] == agent_id]

    def dev_clock(self, seconds: float) -> None:
        self.expect_ok(self.http.post("/api/dev/clock", json={"advance_seconds": seconds}))

    def diagnostics(self) -> str:
        return f"computer stderr:\n{self.computer.stderr()[-4000:]}"

    def check_engine(self) -> None:
        """Assert every turn so far ran in `engine_mode`: no silent fallback passes.

        Warm: turns ran on warm servers (`crew_warm_turns_total` > 0), none ran
        cold, and no agent was moved to cold. Cold: the Computer has no warm pool
        at all (no warm counters in `/metrics`, no `warm` in `/health`), so no
        warm server can have started, and every agent says cold.
        """
        with self.computer.introspection() as local:
            counters = warm_counters(local.get("/metrics").text)
            health = local.get("/health").json()
            agents = local.get("/agents").json()
        engines = {row["handle"]: row["engine"] for row in agents}
        if self.engine_mode == "warm":
            assert counters.get("crew_cold_turns_total") == 0, (counters, self.diagnostics())
            assert counters.get("crew_warm_turns_total", 0) > 0, counters
            assert counters.get("crew_warm_starts_total", 0) > 0, counters
            assert health.get("warm") is not None, health
            assert all(
                e["engine_mode"] == "warm" and e["cold_reason"] is None for e in engines.values()
            ), engines
        else:
            assert counters == {}, counters
            assert health.get("warm") is None, health
            assert all(e["engine_mode"] == "cold" for e in engines.values()), engines


def warm_counters(metrics: str) -> dict[str, float]:
    """The `crew_warm_*` and `crew_cold_*` samples of a Prometheus text."""
    samples = (line.split() for line in metrics.splitlines() if not line.startswith("#"))
    return {
        name: float(value)
        for name, value in (s for s in samples if len(s) == 2)
        if name.startswith(("crew_warm_", "crew_cold_"))
    }


def _need(path: Path, what: str) -> None:
    if not path.exists():
        required_in_ci(what)


@contextlib.contextmanager
def running_chain(
    database: str | None = None, engine_mode: str = "warm", **bootstrap_extra: Any
) -> Iterator[Chain]:
    """Start the whole chain in a fresh short temp dir (Unix socket paths stay short).

    `engine_mode` ("warm" or "cold") goes into the Computer's bootstrap, and so do
    `bootstrap_extra` fields (e.g. `retry_base_s`).

    With `database` (a PostgreSQL URL) two server processes share it: the Computer
    talks to the first (`chain.server`), the user's calls (`chain.http`) go to the second.
    Set CREW_E2E_KEEP=1 to keep the directory (logs, database, agent dirs) afterwards.
    """
    _need(OPENCODE, "OpenCode (scripts/setup installs it into tools/opencode)")
    _need(Path(shutil.which("bwrap") or "/nonexistent"), "bubblewrap (apt-get install bubblewrap)")
    root = Path(tempfile.mkdtemp(prefix="crew-e2e-"))
    home, crew_home = root / "home", root / "crew"
    home.mkdir()
    (root / "server").mkdir()
    with contextlib.ExitStack() as stack:
        if os.environ.get("CREW_E2E_KEEP") != "1":
            stack.callback(shutil.rmtree, root, ignore_errors=True)
        model = stack.enter_context(ScriptedModel(Script()))
        server = stack.enter_context(start_crew_server(root / "server", db=database))
        user_server = server
        if database is not None:
            user_server = stack.enter_context(start_crew_server(root / "server", db=database))
        write_scripted_login(home, model.base_url, price_in_config=True)
        http = stack.enter_context(
            httpx.Client(base_url=user_server.url, timeout=10, headers=server.user_headers)
        )
        created = server.create_computer("e2e")
        bootstrap = {
            "server_url": server.url,
            "token": created["token"],
            "crew_home": str(crew_home),
            "opencode_path": str(OPENCODE),
            "engine_mode": engine_mode,
            **bootstrap_extra,
        }
        try:
            computer = start_computer(user_env(home, crew_home), bootstrap, crew_home, root)
        except DemoError as exc:
            pytest.fail(str(exc))
        stack.callback(_stop_computer, computer)
        chain = Chain(root, server, model, computer, created["computer_id"], http, engine_mode)
        health = wait_until("the Computer's launcher health", computer.health, START_TIMEOUT_S)
        if not health["sandbox"]["ok"]:
            pytest.fail(f"the sandbox is not usable here: {health['sandbox']['reason']}")
        yield chain


def _stop_computer(computer: ComputerProcess) -> None:
    code = computer.stop()
    if code != 0:
        print(f"crew-computer exited {code}; stderr:\n{computer.stderr()[-3000:]}")
