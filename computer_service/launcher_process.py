"""The sandbox launcher as the Computer's child process (`LauncherProcess`).

The Computer starts the launcher (docs/contracts.md "Launcher process") as
this interpreter, isolated (`launcher_argv`), hands it a bearer secret over
stdin and waits for its `ready` line; closing its stdin tells it to exit.
`check_launcher_starts` tries the same command before the Computer says ready.
The API spoken once it listens is `launcher_client.py`'s.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import anyio
import orjson
from anyio.abc import Process

from computer_service.launcher_client import LauncherClient, LauncherUnavailable

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0


# `python -I` ignores PYTHONPATH, the working directory and the user's site-packages, so
# nothing in the environment can change the code the launcher runs; but a `pip install
# --user` Computer lives in the user's site-packages. The launcher therefore imports from
# exactly the directories this interpreter already imports from (its `sys.path`, passed
# in its argv), however the package was installed: a venv, pipx or `--user`.
LAUNCHER_BOOT = (
    "import json, runpy, sys; module = sys.argv.pop(1); sys.path[:] = json.loads(sys.argv.pop(1)); "
    "runpy.run_module(module, run_name='__main__', alter_sys=True)"
)


def import_path() -> list[str]:
    """This interpreter's import directories, absolute (a relative entry would follow the cwd)."""
    return [entry for entry in sys.path if entry and Path(entry).is_absolute()]


def launcher_command(module: str = "sandbox_launcher") -> list[str]:
    """`python -I` running `module` with this interpreter's import path (`LAUNCHER_BOOT`)."""
    return [sys.executable, "-I", "-c", LAUNCHER_BOOT, module, orjson.dumps(import_path()).decode()]


def launcher_argv(
    crew_home: Path,
    run_id: str,
    socket_path: Path,
    *,
    mode: str | None = None,
    opencode_path: str | None = None,
    read_only_roots: tuple[Path, ...] = (),
    limit_args: list[str] | None = None,
) -> list[str]:
    """The launcher's command line (docs/contracts.md): this interpreter, isolated.

    `limit_args`: the turn limits' flags (`bootstrap.TurnLimits.launcher_args`).
    """
    argv = [
        *launcher_command(),
        "serve",
        "--crew-home",
        str(crew_home),
        "--run-id",
        run_id,
        "--socket",
        str(socket_path),
    ]
    if mode:
        argv += ["--mode", mode]
    if opencode_path:
        argv += ["--opencode", opencode_path]
    for root in read_only_roots:
        argv += ["--read-only-root", str(root)]
    return argv + (limit_args or [])


def check_launcher_starts(timeout_s: float = 30.0) -> None:
    """Run the launcher's `--version` as the Computer will start it; `LauncherUnavailable` if not.

    Checked before `ready`: an installation whose launcher cannot even start (a
    package the isolated interpreter cannot import) can run no agent at all.
    """
    argv = [*launcher_command(), "--version"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LauncherUnavailable(f"the sandbox launcher cannot start: {exc}") from exc
    if done.returncode != 0 or not done.stdout.startswith("crew-launcher "):
        said = (done.stderr.strip().splitlines() or [done.stdout.strip() or "nothing"])[-1]
        raise LauncherUnavailable(
            f"the sandbox launcher cannot start with {sys.executable} (exit status "
            f"{done.returncode}: {said[:300]}); reinstall crew-computer (README: Install)"
        )


class LauncherProcess:
    """The launcher as a child process: start, wait for `ready`, stop by closing stdin.

    Use `start()` then `client()`; `wait()` returns when it dies (exit code),
    so the owner can notice a dead launcher and start a new one.
    """

    def __init__(
        self,
        argv: list[str],
        socket_path: Path,
        env: Mapping[str, str] | None = None,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        self.argv = argv
        self.stop_grace_s = stop_grace_s
        self.socket_path = socket_path
        self.secret = secrets.token_urlsafe(32)
        self._env = dict(env) if env is not None else None
        self._process: Process | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def returncode(self) -> int | None:
        return self._process.returncode if self._process else None

    async def start(self, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start the launcher, hand it the secret, wait for its `ready` line.

        Raises `LauncherUnavailable` when it exits or stays silent.
        """
        self._process = await anyio.open_process(
            self.argv,
            stdin=-1,
            stdout=-1,
            stderr=None,  # its log lines go to our stderr
            env=self._env,
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        try:
            await self._process.stdin.send(self.secret.encode() + b"\n")
            line = b""
            with anyio.fail_after(ready_timeout_s):
                while not line.endswith(b"\n"):
                    try:
                        line += await self._process.stdout.receive(64)
                    except (anyio.EndOfStream, anyio.ClosedResourceError):
                        break
        except TimeoutError:
            await self.stop()
            raise LauncherUnavailable(
                f"the launcher did not say ready within {ready_timeout_s:.0f} s"
            ) from None
        except (anyio.BrokenResourceError, OSError) as exc:
            await self.stop()
            raise LauncherUnavailable(f"the launcher died at start: {exc}") from exc
        if line.strip() != b"ready":
            code = await self.stop()
            raise LauncherUnavailable(
                f"the launcher exited before it was ready (exit status {code}, "
                f"said {line[:200].decode('utf-8', 'replace').strip()!r}); see its log above"
            )

    def client(self) -> LauncherClient:
        """A client for this launcher's socket and secret."""
        return LauncherClient(self.socket_path, self.secret)

    async def wait(self) -> int:
        """Wait until the launcher exits; its exit status."""
        if self._process is None:
            raise LauncherUnavailable("the launcher was never started")
        return await self._process.wait()

    async def stop(self, grace_s: float | None = None) -> int | None:
        """Close its stdin (its signal to exit), then SIGTERM, then SIGKILL; its exit status."""
        grace_s = self.stop_grace_s if grace_s is None else grace_s
        proc = self._process
        if proc is None:
            return None
        with anyio.CancelScope(shield=True):
            if proc.stdin is not None:
                with contextlib.suppress(anyio.BrokenResourceError, OSError):
                    await proc.stdin.aclose()
            for sig, then in ((None, "SIGTERM"), (signal.SIGTERM, "SIGKILL"), (signal.SIGKILL, "")):
                if sig is not None and proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(sig)
                with anyio.move_on_after(grace_s):
                    await proc.wait()
                if proc.returncode is not None or not then:
                    break
                log.warning("the launcher did not exit in %.0f s; sending %s", grace_s, then)
            if proc.stdout is not None:
                with contextlib.suppress(anyio.BrokenResourceError, OSError):
                    await proc.stdout.aclose()
        return proc.returncode
