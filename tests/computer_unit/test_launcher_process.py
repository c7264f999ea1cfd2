"""LauncherProcess with a child stand-in of the launcher; the launcher's command line."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import orjson
import pytest

from computer_service.launcher_client import LauncherUnavailable
from computer_service.launcher_process import LauncherProcess, launcher_argv, launcher_command
from crew_testkit.computer_proc import FAKE_OPENCODE
from tests.computer_unit.engine_fixtures import short_dir

pytestmark = pytest.mark.anyio

FAKE = str(FAKE_OPENCODE)
STANDIN = str(Path(__file__).resolve().parent / "launcher_standin.py")


@pytest.fixture
def sock() -> Iterator[Path]:
    """A short Unix socket path (they are limited to ~108 bytes), removed afterwards."""
    with short_dir() as d:
        yield d / "l.sock"


def test_launcher_argv() -> None:
    argv = launcher_argv(
        Path("/c"), "run-1", Path("/c/sockets/l.sock"), mode="tmpfs", opencode_path="/x/oc"
    )
    assert argv == [
        *launcher_command(), "serve", "--crew-home", "/c",
        "--run-id", "run-1", "--socket", "/c/sockets/l.sock", "--mode", "tmpfs", "--opencode", "/x/oc",
    ]  # fmt: skip
    assert "--mode" not in launcher_argv(Path("/c"), "r", Path("/s"))
    # `python -I`, importing from exactly this interpreter's directories (a `--user` install).
    python, isolated, _, boot, module, path = launcher_command()
    assert (python, isolated, module) == (sys.executable, "-I", "sandbox_launcher")
    assert orjson.loads(path) == [p for p in sys.path if p and Path(p).is_absolute()]
    assert "sys.path[:] = " in boot
    roots = (Path("/srv/repo"), Path("/home/u/src"))
    assert launcher_argv(Path("/c"), "r", Path("/s"), read_only_roots=roots)[-4:] == [
        "--read-only-root", "/srv/repo", "--read-only-root", "/home/u/src",
    ]  # fmt: skip


@pytest.mark.timeout(60)
async def test_launcher_process_lifecycle(tmp_path: Path, sock: Path) -> None:
    proc = LauncherProcess([sys.executable, STANDIN, str(sock), FAKE], sock)
    await proc.start(ready_timeout_s=30)
    async with proc.client() as client:
        assert (await client.health()).sandbox.ok  # the secret went over stdin
    assert await proc.stop() == 0  # closing stdin ends it


@pytest.mark.timeout(60)
async def test_launcher_process_death_is_seen(tmp_path: Path, sock: Path) -> None:
    proc = LauncherProcess([sys.executable, STANDIN, str(sock), FAKE], sock)
    await proc.start(ready_timeout_s=30)
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    with anyio.fail_after(10):
        assert await proc.wait() == -signal.SIGKILL
    async with proc.client() as client:
        with pytest.raises(LauncherUnavailable):
            await client.health()
    await proc.stop()


@pytest.mark.timeout(30)
async def test_launcher_that_exits_before_ready(tmp_path: Path) -> None:
    proc = LauncherProcess(
        [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"],
        tmp_path / "s",
    )
    with pytest.raises(LauncherUnavailable, match="exit status 3"):
        await proc.start(ready_timeout_s=10)


@pytest.mark.timeout(30)
async def test_launcher_that_stays_silent(tmp_path: Path) -> None:
    proc = LauncherProcess(
        [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "s", stop_grace_s=0.5
    )
    with pytest.raises(LauncherUnavailable, match="did not say ready"):
        await proc.start(ready_timeout_s=0.5)
    assert proc.returncode is not None
