"""Launcher test support: a crew home laid out like the Computer does, a fake engine, a real launcher process."""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from sandbox_launcher.bwrap import BwrapTools, find_tools
from tests.support.ci import required_in_ci
from tests.support.users import unprivileged_uid

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")
PYTHON = os.path.realpath(sys.executable)
READY_TIMEOUT_S = 30.0


@dataclass
class CrewLayout:
    """`<crew home>` with one Computer run and agents, as computer.md §4 lays them out."""

    home: Path
    crew_home: Path
    run_id: str

    @property
    def run_dir(self) -> Path:
        return self.crew_home / "runtime" / self.run_id

    @property
    def bin_dir(self) -> Path:
        return self.run_dir / "bin"

    def agent_dir(self, agent_id: str) -> Path:
        return self.crew_home / "agents" / agent_id

    def runtime_dir(self, agent_id: str) -> Path:
        return self.run_dir / "agents" / agent_id

    def add_agent(self, agent_id: str) -> None:
        for path in (self.agent_dir(agent_id) / "work", self.runtime_dir(agent_id) / "tmp"):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.runtime_dir(agent_id) / "token").write_text(f"token-of-{agent_id}\n")

    def run_request(self, agent_id: str, stdin: Any, **extra: Any) -> dict[str, Any]:
        """A valid `POST /runs` body; `stdin` is sent as JSON (the fake engine's script)."""
        runtime = self.runtime_dir(agent_id)
        body: dict[str, Any] = {
            "run_id": str(uuid.uuid4()),
            "agent_id": agent_id,
            "agent_dir": str(self.agent_dir(agent_id)),
            "runtime_dir": str(runtime),
            "bin_dir": str(self.bin_dir),
            "interpreter_dirs": [],
            "model": "local/scripted",
            "session_id": None,
            "env": {
                "PATH": f"{self.bin_dir}:/usr/local/bin:/usr/bin:/bin",
                "HOME": str(self.agent_dir(agent_id)),
                "TMPDIR": str(runtime / "tmp"),
                "LANG": "C.UTF-8",
                "CREW_TOKEN_FILE": str(runtime / "token"),
            },
            "stdin": orjson.dumps(stdin).decode(),
        }
        body.update(extra)
        return body


def make_layout(home: Path) -> CrewLayout:
    """A crew home in `home` with the Computer's run directory and `bin/crew`."""
    crew_home = home / ".crew"
    layout = CrewLayout(home=home, crew_home=crew_home, run_id=uuid.uuid4().hex[:12])
    for path in (crew_home / "sockets", layout.bin_dir):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(crew_home, 0o700)
    (layout.bin_dir / "crew").write_text("#!/bin/sh\necho crew-wrapper\n")
    return layout


def write_fake_opencode(directory: Path) -> Path:
    """An executable `opencode`: `fake_engine.py` itself, run by this interpreter.

    The script is copied rather than referred to: a checkout under `/tmp` is
    hidden inside the sandbox (each agent gets a private `/tmp`).
    """
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "opencode"
    script.write_text(f"#!{PYTHON} -IS\n" + FAKE_ENGINE.read_text())
    script.chmod(0o755)
    return script


class LauncherProcess:
    """A real `python -I -m sandbox_launcher serve …` process, as the Computer starts it."""

    def __init__(
        self,
        layout: CrewLayout,
        opencode: Path | None,
        mode: str | None = None,
        secret: str | None = None,
        env: dict[str, str] | None = None,
        read_only_roots: tuple[Path, ...] = (),
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.layout = layout
        self.secret = secret or secrets.token_urlsafe(24)
        self.socket = layout.crew_home / "sockets" / f"launcher-{layout.run_id}.sock"
        argv = [sys.executable, "-I", "-m", "sandbox_launcher", "serve"]
        argv += ["--crew-home", str(layout.crew_home), "--run-id", layout.run_id]
        argv += ["--socket", str(self.socket)]
        if mode:
            argv += ["--mode", mode]
        if opencode:
            argv += ["--opencode", str(opencode)]
        for root in read_only_roots:
            argv += ["--read-only-root", str(root)]
        argv += extra_args
        # stderr to a file: a full pipe nobody reads would block the launcher.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
        self._result: tuple[int, str] | None = None
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd="/",
            env={**os.environ, **env} if env is not None else None,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{self.secret}\n".encode())
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()  # blocks until ready or exit
        if line != b"ready\n":
            self.proc.kill()
            _, err = self.stop()
            raise AssertionError(f"launcher did not get ready: {line!r} {err[-2000:]}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self, secret: str | None = None, timeout: float = 30.0) -> httpx.Client:
        """An httpx client over the launcher's Unix socket, with the bearer secret."""
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)),
            base_url="http://launcher",
            headers={"Authorization": f"Bearer {secret or self.secret}"},
            timeout=timeout,
        )

    def run(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """POST /runs and collect every frame until the stream ends."""
        with self.client() as client, client.stream("POST", "/runs", json=body) as response:
            assert response.status_code == 200, response.read()
            return [orjson.loads(line) for line in response.iter_lines() if line]

    def stop(self) -> tuple[int, str]:
        """Close stdin (the Computer's "stop") and wait; returns (exit status, stderr)."""
        if self._result is not None:
            return self._result
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._stderr.seek(0)
        err = self._stderr.read().decode("utf-8", "replace")
        self._stderr.close()
        self._result = (self.proc.returncode, err)
        return self._result


def engine_lines(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fake engine's JSON lines out of the `line` frames."""
    out = []
    for frame in frames:
        if frame["t"] == "line":
            try:
                out.append(orjson.loads(frame["data"]))
            except orjson.JSONDecodeError:
                out.append({"raw": frame["data"]})
    return out


def children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, comm) of the live (not zombie) children of `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append((int(entry), comm))
    return found


def processes_with(marker: str) -> list[int]:
    """Pids on the host whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


# ---- probes run as the caller, or (as root) as an ordinary user ----

SYSTEM_PYTHON = "/usr/bin/python3"


def probe_uid(param: str) -> int:
    """The uid a probe runs as: the caller's, or (root asking for "unprivileged") a user the
    tests made (`tests/support/users.py`)."""
    if param == "caller" or os.getuid() != 0:
        return os.getuid()
    if not os.path.exists(SYSTEM_PYTHON):
        required_in_ci(f"{SYSTEM_PYTHON} (Debian package python3)")
    return unprivileged_uid()


@contextmanager
def public_temp_dir(prefix: str) -> Iterator[Path]:
    """A 0755 directory below /var/tmp (like a real /home: outside the sandbox's private /tmp)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def tools_for(uid: int, nproc: int) -> BwrapTools:
    """bwrap's tools for a probe as `uid`: the system Python runs the helper for another user
    (the test's own interpreter may sit in /root)."""
    tools = find_tools()
    if uid == os.getuid():
        return tools
    helper_dir = Path(tools.helper).parent
    return dataclasses.replace(
        tools, python=SYSTEM_PYTHON, support_dirs=(Path("/usr"), helper_dir), nproc=nproc
    )


def run_probe(
    argv: list[str], run_as: int, env: dict[str, str], cwd: Path
) -> dict[str, tuple[int, str]]:
    """Run a sandbox's argv as `run_as` (the engines' user) and read its probe's lines;
    the sandbox must exit 0 and the probe say something."""
    other = run_as != os.getuid()
    done = subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        start_new_session=True,
        user=run_as if other else None,
        group=run_as if other else None,
        extra_groups=[] if other else None,
    )
    results = probe_results(done.stdout)
    assert done.returncode == 0 and results, (done.returncode, done.stdout, done.stderr)
    return results


def probe_results(stdout: str) -> dict[str, tuple[int, str]]:
    """`name rc output` lines of a probe script: {name: (rc, output)}."""
    found = {}
    for line in stdout.splitlines():
        name, rc, *out = line.split(" ", 2)
        found[name] = (int(rc), out[0] if out else "")
    return found
