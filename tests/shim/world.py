"""The `crew` tests' world: a reference server with two agents, and runs of the installed `crew`."""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.shim.snapshots import Normaliser, SnapshotFile

CREW_BIN = Path(sys.executable).with_name("crew")
EXAMPLE_ID = "0b6c1e2a-5d7f-4c1a-9e3b-2f8a6d4c7e10"  # the id in the help texts' examples


@dataclass
class Result:
    """One `crew` run: what it was given and what it printed."""

    argv: list[str]
    stdin: bytes | None
    code: int
    stdout: str
    stderr: str

    def render(self, normalise: Normaliser) -> str:
        """The case as it stands in the snapshot file."""
        command = "$ " + " ".join(["crew", *(shlex.quote(arg) for arg in self.argv)])
        if self.stdin is not None:
            command += " <<'EOF'\n" + self.stdin.decode("utf-8", "replace").rstrip("\n") + "\nEOF"
        return normalise(
            f"{command}\nexit {self.code}\n--- stdout\n{self.stdout}--- stderr\n{self.stderr}"
        ).rstrip("\n")


@dataclass
class Agent:
    id: str
    handle: str
    token_file: Path


@dataclass
class World:
    """A server with two agents, a group of both and a dm of each, plus a crew runner."""

    server: Any
    tmp_path: Path
    alice: Agent
    bob: Agent
    group: dict[str, Any]
    dm: dict[str, Any]
    bob_dm: dict[str, Any]
    snapshots: SnapshotFile
    normalise: Normaliser = field(default_factory=Normaliser)

    def check(self, name: str, result: Result) -> None:
        """Compare one run with its section in tests/snapshots/shim-output.md."""
        self.snapshots.check(name, result.render(self.normalise))

    def crew(
        self,
        *argv: str,
        stdin: str | bytes | None = None,
        agent: Agent | None = None,
        url: str | None = None,
        timeout: float = 30,
        extra_env: dict[str, str] | None = None,
    ) -> Result:
        """Run the installed `crew` with only CREW_SERVER_URL and CREW_TOKEN_FILE set."""
        data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
        env = {
            "CREW_SERVER_URL": url or self.server.url,
            "CREW_TOKEN_FILE": str((agent or self.alice).token_file),
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            **(extra_env or {}),
        }
        done = subprocess.run(
            [str(CREW_BIN), *argv],
            input=data if data is not None else b"",
            capture_output=True,
            env=env,
            timeout=timeout,
            check=False,
        )
        return Result(
            list(argv),
            data,
            done.returncode,
            done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"),
        )

    def messages(self, room_id: str) -> list[dict[str, Any]]:
        """The room's messages as the server stored them."""
        return list(self.server.messages(room_id))


def make_agent(server: Any, computer: dict[str, Any], handle: str, tmp_path: Path) -> Agent:
    agent = server.create_agent(handle, computer_id=computer["computer_id"])
    answer = httpx.post(
        f"{server.url}/computer/agents/{agent['id']}/token",
        headers=server.connection(computer),
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    token_file = tmp_path / f"{handle}.token"
    token_file.write_text(answer.json()["token"] + "\n")
    return Agent(agent["id"], handle, token_file)
