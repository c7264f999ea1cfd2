"""`crew-computer` as a real subprocess for process tests and the pipeline benchmark."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

FAKE_OPENCODE = Path(__file__).resolve().with_name("fake_opencode.py")
READY_TIMEOUT_S = 30.0


@dataclass
class Machine:
    """A short temporary root (Unix socket paths stay short) with a user HOME and a crew home."""

    root: Path

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def crew_home(self) -> Path:
        return self.root / "crew"

    def env(self) -> dict[str, str]:
        """The Computer's environment: this HOME, nothing of the real user's."""
        env = {k: os.environ[k] for k in ("PATH", "LANG", "TZ", "CI") if k in os.environ}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env["HOME"] = str(self.home)
        env["CREW_HOME"] = str(self.crew_home)
        return env

    def log_in(self) -> None:
        """Write an OpenCode login the engine accepts (the fake opencode ignores it)."""
        auth = self.home / ".local" / "share" / "opencode" / "auth.json"
        auth.parent.mkdir(parents=True, exist_ok=True)
        auth.write_bytes(orjson.dumps({"local": {"type": "api", "key": "test-key"}}))
        auth.chmod(0o600)


@contextlib.contextmanager
def machine() -> Iterator[Machine]:
    root = Path(tempfile.mkdtemp(prefix="cc-"))
    (root / "home").mkdir()
    try:
        yield Machine(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


class ComputerProc:
    """A running `crew-computer`; stdin stays open until `stop()`."""

    def __init__(self, proc: subprocess.Popen[bytes], crew_home: Path, stderr_path: Path) -> None:
        self.proc = proc
        self.crew_home = crew_home
        self.stderr_path = stderr_path

    @property
    def socket(self) -> Path:
        return self.crew_home / "sockets" / "computer.sock"

    def local(self) -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)),
            base_url="http://computer",
            timeout=10,
        )

    def get(self, path: str) -> Any:
        with self.local() as client:
            response = client.get(path)
            assert response.status_code == 200, response.text
            return response.json()

    def health_known(self) -> dict[str, Any] | None:
        """`/health` once the launcher's answer is in."""
        try:
            health: dict[str, Any] = self.get("/health")
        except (httpx.TransportError, AssertionError):
            return None
        return health if health["sandbox"]["ok"] is not None else None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self, how: str = "stdin", timeout: float = 30.0) -> int:
        """Stop by closing stdin (or a signal); the exit status."""
        if self.proc.poll() is None:
            if how == "stdin":
                assert self.proc.stdin is not None
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
            else:
                self.proc.send_signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(
                    f"crew-computer did not stop in {timeout} s:\n{self.stderr()[-3000:]}"
                ) from None
        return self.proc.returncode


def launch(
    m: Machine,
    bootstrap: dict[str, Any] | bytes,
    *,
    wait_ready: bool = True,
    wrap: list[str] | None = None,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> ComputerProc:
    """Start `python -m computer_service`, write the bootstrap line, wait for `ready`.

    `command`: another Computer (an installed `crew-computer`); `env`: added to `m.env()`.
    """
    stderr_path = m.root / f"computer-{time.monotonic_ns()}.log"
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(
            [*(wrap or []), *(command or [sys.executable, "-m", "computer_service"])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=m.env() | (env or {}),
            cwd=m.root,
        )
    assert proc.stdin is not None and proc.stdout is not None
    line = bootstrap if isinstance(bootstrap, bytes) else orjson.dumps(bootstrap) + b"\n"
    proc.stdin.write(line)
    proc.stdin.flush()
    computer = ComputerProc(proc, m.crew_home, stderr_path)
    if wait_ready:
        ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT_S)
        got = proc.stdout.readline() if ready else b""
        if got != b"ready\n":
            computer.stop(timeout=5)
            raise AssertionError(f"no ready (got {got!r}): {computer.stderr()[-3000:]}")
    return computer


def bootstrap_for(server_url: str, token: str, m: Machine, **extra: Any) -> dict[str, Any]:
    return {
        "server_url": server_url,
        "token": token,
        "crew_home": str(m.crew_home),
        "opencode_path": str(FAKE_OPENCODE),
        "engine_mode": "cold",  # the fake opencode speaks `run` only, not `serve`
        **extra,
    }


def launcher_pids(parent: int) -> list[int]:
    """The sandbox launcher processes whose parent is `parent` (the Computer)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat_fields[1]) == parent and b"sandbox_launcher" in cmdline:
            pids.append(int(entry.name))
    return pids
