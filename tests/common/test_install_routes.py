"""Every documented install route gives a Computer whose sandbox launcher starts (issue 20, 16).

The README installs with a wheel into a venv, with pipx, or with `python3 -m pip
install --user .`. The launcher runs as `python -I …`, which ignores the user's
site-packages: a `--user` Computer used to print `ready` and then run forever with
no sandbox. Each route here is installed for real (offline, from the local package
index the machine's pip is configured with) and its `crew-computer` is started
against a real crew server until the launcher's self-test is in `/health`.

Cost: ~3 s to build the wheel, ~5 s per install, ~2 s per Computer (about 30 s in all
on an idle machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import Machine, bootstrap_for, launch, machine
from crew_testkit.crew_server_proc import CrewServer, start_crew_server
from sandbox_launcher.backend import SLOW_TOOL_SHELL_NOTE

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


def pip_env(home: Path) -> dict[str, str]:
    """pip's environment: a temporary HOME (its cache, `--user`), the machine's index settings."""
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k in ("PATH", "LANG")}
    # A Debian python refuses `--user` without it (PEP 668); the README's route is the user's.
    return env | {"HOME": str(home), "PIP_BREAK_SYSTEM_PACKAGES": "1", "PIP_NO_INPUT": "1"}


def run(argv: list[str | Path], env: dict[str, str]) -> None:
    done = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, env=env, timeout=240
    )
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project's files (tracked and new), as a user's checkout has them."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    dest = tmp_path_factory.mktemp("src")
    for name in filter(None, listed.split("\0")):
        if name.startswith(("tests/", "benchmarks/")) or not (ROOT / name).is_file():
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    home = tmp_path_factory.mktemp("pip-home")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, source], pip_env(home))
    (built,) = out.glob("crew_computer-*.whl")
    return built


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrewServer]:
    with start_crew_server(tmp_path_factory.mktemp("server")) as crew_server:
        yield crew_server


@pytest.fixture
def m() -> Iterator[Machine]:
    with machine() as box:
        yield box


def venv_with(wheel: Path, where: Path, home: Path) -> Path:
    """A venv at `where` with the wheel installed; its bin directory."""
    run([sys.executable, "-m", "venv", where], pip_env(home))
    run([where / "bin" / "python", "-m", "pip", "install", "-q", wheel], pip_env(home))
    return where / "bin"


def base_python() -> str:
    """The interpreter this venv was made from: a user's `python3` (venvs refuse `--user`)."""
    return str(getattr(sys, "_base_executable", None) or sys.executable)


def started_sandbox(computer_command: list[str], m: Machine, server: CrewServer) -> dict[str, Any]:
    """Start that Computer against `server`; its `/health` once the launcher answered."""
    token = server.create_computer()["token"]
    computer = launch(m, bootstrap_for(server.url, token, m), command=computer_command)
    try:
        health = wait_until("the launcher's health", computer.health_known, timeout=60)
    finally:
        assert computer.stop() == 0, computer.stderr()[-3000:]
    return health


def assert_launcher_started(health: dict[str, Any]) -> None:
    sandbox = health["sandbox"]
    assert sandbox["ok"] is True, sandbox
    assert sandbox["backend"] == "bwrap", sandbox
    # No checkout's scripts/setup build: the installed launcher built its own native helper.
    assert SLOW_TOOL_SHELL_NOTE not in (sandbox.get("reason") or ""), sandbox


def test_a_wheel_in_a_venv(wheel: Path, m: Machine, server: CrewServer) -> None:
    bin_dir = venv_with(wheel, m.root / "venv", m.home)
    assert_launcher_started(started_sandbox([str(bin_dir / "crew-computer")], m, server))


def test_pipx(wheel: Path, m: Machine, server: CrewServer) -> None:
    """pipx: its own venv under PIPX_HOME, the console script linked into PIPX_BIN_DIR.

    This machine's package index has no pipx; without one on PATH the test builds
    exactly the layout `pipx install` makes (a venv, a symlink to its script).
    """
    pipx_home, bin_dir = m.root / "pipx", m.home / ".local" / "bin"
    pipx = shutil.which("pipx")
    if pipx is not None:
        env = pip_env(m.home) | {"PIPX_HOME": str(pipx_home), "PIPX_BIN_DIR": str(bin_dir)}
        run([pipx, "install", wheel], env)
    else:
        venv_bin = venv_with(wheel, pipx_home / "venvs" / "crew-computer", m.home)
        bin_dir.mkdir(parents=True)
        (bin_dir / "crew-computer").symlink_to(venv_bin / "crew-computer")
    assert_launcher_started(started_sandbox([str(bin_dir / "crew-computer")], m, server))


def test_pip_install_user(source: Path, m: Machine, server: CrewServer) -> None:
    """The README's `python3 -m pip install --user .`: the package is in the user's site dir."""
    run([base_python(), "-m", "pip", "install", "-q", "--user", source], pip_env(m.home))
    script = m.home / ".local" / "bin" / "crew-computer"
    assert script.is_file()
    assert_launcher_started(started_sandbox([str(script)], m, server))


def test_a_launcher_that_cannot_start_is_an_exit_not_ready(
    wheel: Path, m: Machine, server: CrewServer
) -> None:
    """An installation whose launcher cannot start: exit 1 with the reason, never `ready`."""
    bin_dir = venv_with(wheel, m.root / "venv", m.home)
    (site,) = (m.root / "venv" / "lib").glob("python3*/site-packages")
    (site / "sandbox_launcher" / "__main__.py").unlink()  # a broken installation
    token = server.create_computer()["token"]
    computer = launch(
        m,
        bootstrap_for(server.url, token, m),
        command=[str(bin_dir / "crew-computer")],
        wait_ready=False,
    )
    assert computer.proc.stdout is not None
    try:
        status = computer.proc.wait(timeout=60)  # before the fix: `ready`, then forever
    finally:
        computer.stop(timeout=5)
    assert status == 1
    assert computer.proc.stdout.read() == b""
    assert "crew-computer: the sandbox launcher cannot start" in computer.stderr()
