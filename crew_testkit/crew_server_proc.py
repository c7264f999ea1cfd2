"""A real `crew-server --dev` subprocess for tests: free loopback port, temp db.

The server writes its user token to `<tmp>/user-token` at first start
(`--user-token-file`); `CrewServer.client()` sends it, and a restart on the same
tmp dir and db reads the same file.

with start_crew_server(tmp_path) as server:
    computer = server.create_computer()
    alice = server.create_agent("alice", computer_id=computer["computer_id"])
    room = server.create_room("dm", [alice["id"]])
    server.post(room["id"], "hello @alice")
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from crew_harness.ports import free_port
from crew_harness.waiting import WaitTimeout, wait_until

START_TIMEOUT = 20.0
USER_TOKEN_FILE = "user-token"


def computer_connection(client: httpx.Client, token: str) -> dict[str, str]:
    """Connect as the Computer of `token`: the headers of that connection (`Crew-Epoch`)."""
    headers = {"Authorization": f"Bearer {token}"}
    answer = client.post(
        "/computer/connect",
        json={"hostname": "h", "platform": "linux", "version": "1", "capacity": 2},
        headers=headers,
    )
    answer.raise_for_status()
    return headers | {"Crew-Epoch": str(answer.json()["epoch"])}


class CrewServer:
    """A running reference server; `.url`, `.client()` on the user API, and helpers."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        url: str,
        db: Path | str,
        log: Path,
        user_token_file: Path | None = None,
    ) -> None:
        self.process = process
        self.url = url
        self.db = db
        self.log = log
        self.user_token_file = user_token_file or log.parent / USER_TOKEN_FILE
        self._client: httpx.Client | None = None

    # ------------------------------------------------------------ life

    @property
    def user_token(self) -> str:
        """The user token the server wrote at first start."""
        try:
            return self.user_token_file.read_text().strip()
        except FileNotFoundError:
            raise RuntimeError(
                f"no user token at {self.user_token_file}: the server writes it only when it "
                f"creates the token, so restart on the tmp dir of the first start"
            ) from None

    @property
    def user_headers(self) -> dict[str, str]:
        """`Authorization` for the user API."""
        return {"Authorization": f"Bearer {self.user_token}"}

    def client(self) -> httpx.Client:
        """An httpx.Client on the user API, sending the user token; shared, closed at stop.

        A request that passes its own `Authorization` (a Computer's or an agent's
        token) sends that one instead.
        """
        if self._client is None:
            self._client = httpx.Client(base_url=self.url, timeout=10.0, headers=self.user_headers)
        return self._client

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; idempotent."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def __enter__(self) -> CrewServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def output(self) -> str:
        """What the server wrote to stdout/stderr so far (for failure messages)."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    # ------------------------------------------------------------ user API helpers

    def _ok(self, response: httpx.Response) -> Any:
        if response.status_code >= 300:
            raise AssertionError(
                f"{response.request.method} {response.request.url.path} → "
                f"{response.status_code}: {response.text}"
            )
        return response.json() if response.content else None

    def create_computer(self, name: str = "test-computer") -> dict[str, Any]:
        """→ `{computer_id, token}`."""
        return dict(self._ok(self.client().post("/api/computers", json={"name": name})))

    def connection(self, computer: dict[str, Any]) -> dict[str, str]:
        """The headers of the Computer's connection, connecting it once (as a Computer
        does at start): later calls reuse it, so tokens minted for it stay valid."""
        if "headers" not in computer:
            computer["headers"] = computer_connection(self.client(), computer["token"])
        return dict(computer["headers"])

    def create_agent(
        self,
        handle: str,
        *,
        name: str | None = None,
        persona: str = "",
        model: str = "local/scripted",
        computer_id: str | None = None,
        turn_time_limit_s: int | None = None,
    ) -> dict[str, Any]:
        """→ the agent (`id`, `handle`, …)."""
        body = {
            "handle": handle,
            "name": name or handle.capitalize(),
            "persona": persona,
            "model": model,
            "engine": "opencode",
            "computer_id": computer_id,
            "turn_time_limit_s": turn_time_limit_s,
        }
        return dict(self._ok(self.client().post("/api/agents", json=body)))

    def create_room(
        self, kind: str, agent_ids: list[str], title: str | None = None
    ) -> dict[str, Any]:
        """A dm (one agent) or a group (`title` required) → the room."""
        body = {"kind": kind, "agent_ids": agent_ids, "title": title}
        return dict(self._ok(self.client().post("/api/rooms", json=body)))

    def post(self, room_id: str, body: str, thread_of: str | None = None) -> dict[str, Any]:
        """The user posts a message (in the thread of `thread_of` when given) → the message."""
        payload = {"body": body, "thread_of": thread_of}
        return dict(self._ok(self.client().post(f"/api/rooms/{room_id}/messages", json=payload)))

    def messages(self, room_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
        return list(
            self._ok(
                self.client().get(f"/api/rooms/{room_id}/messages", params={"after_seq": after_seq})
            )
        )

    def agents(self) -> list[dict[str, Any]]:
        """Every agent with `status` and `problem`."""
        return list(self._ok(self.client().get("/api/agents")))

    def turns(self, agent_id: str) -> list[dict[str, Any]]:
        return list(self._ok(self.client().get("/api/turns", params={"agent_id": agent_id})))

    def turn(self, turn_id: str) -> dict[str, Any]:
        return dict(self._ok(self.client().get(f"/api/turns/{turn_id}")))

    def positions(self, agent_id: str) -> list[dict[str, Any]]:
        """`[{room_id, delivered_seq, read_seq}]` of an agent."""
        return list(self._ok(self.client().get(f"/api/agents/{agent_id}/positions")))

    def advance_clock(self, seconds: float) -> dict[str, Any]:
        """Move the server clock forward and fire due reminders → `{now, fired}`."""
        return dict(
            self._ok(self.client().post("/api/dev/clock", json={"advance_seconds": seconds}))
        )


def start_crew_server(
    tmp_path: Path,
    *,
    db: Path | str | None = None,
    port: int | None = None,
    args: Sequence[str] = (),
    open_file_limit: int | None = None,
) -> CrewServer:
    """Start `crew-server --dev` on loopback and wait until `/health` answers.

    The user token goes to `tmp_path/user-token` at first start; a restart with the
    same `tmp_path` (and `db`) finds it there. `db` may be a PostgreSQL URL: several
    servers started with it (and one `tmp_path`) share the database and the token.
    `args` go on the command line; `open_file_limit` is its RLIMIT_NOFILE (soft
    and hard, as `ulimit -n` sets it).
    """

    def limit_open_files() -> None:
        if open_file_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_file_limit, open_file_limit))

    tmp_path.mkdir(parents=True, exist_ok=True)
    db = db or tmp_path / "crew.db"
    user_token_file = tmp_path / USER_TOKEN_FILE
    log = tmp_path / f"crew-server-{time.monotonic_ns()}.log"
    for attempt in range(3):
        chosen = port or free_port()
        url = f"http://127.0.0.1:{chosen}"
        with log.open("ab") as sink:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "crew_server",
                    "--db",
                    str(db),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(chosen),
                    "--dev",
                    "--user-token-file",
                    str(user_token_file),
                    *args,
                ],
                preexec_fn=limit_open_files if open_file_limit is not None else None,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        server = CrewServer(process, url, db, log, user_token_file)
        if _wait_ready(server):
            return server
        server.stop()
        if port is not None or attempt == 2:
            break
    raise RuntimeError(f"crew-server did not start; its output:\n{server.output()}")


def _wait_ready(server: CrewServer) -> bool:
    """True once `/health` answers; False when the process exits first or never answers."""

    def answered() -> str | None:
        if server.process.poll() is not None:
            return "exited"  # e.g. the port was taken between choosing and binding
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/health", timeout=1.0).status_code == 200:
                return "ready"
        return None

    try:
        return wait_until("crew-server /health", answered, START_TIMEOUT) == "ready"
    except WaitTimeout:
        return False
