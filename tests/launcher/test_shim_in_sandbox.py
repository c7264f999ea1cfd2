"""`crew` inside a real sandbox, run from an editable checkout below `$HOME` (issue 21).

The Computer grants a sandbox the interpreter, its standard library and the
shim's own directory (`RunDirectory.interpreter_dirs`), never the checkout
around it: a shim that imports another package of the checkout dies there
(`crew --version` did, importing `crew_common`). So the checkout here is a
copy of `crew_shim` and `crew_common` below the sandboxed home, on the path
of a venv by a `.pth` file as an editable install puts it, and `bin/crew` is
the Computer's own wrapper (`RunDirectory.prepare`). Run in both Linux modes
as root and as an unprivileged user (the argv the launcher builds), and
through the real launcher process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from computer_service.run_dir import RunDirectory
from crew_shim.version import VERSION
from sandbox_launcher.backend import BwrapBackend
from sandbox_launcher.bwrap import LinuxMode
from sandbox_launcher.policy import SandboxPolicy
from tests.launcher.helpers import (
    SYSTEM_PYTHON,
    LauncherProcess,
    engine_lines,
    make_layout,
    probe_uid,
    public_temp_dir,
    run_probe,
    tools_for,
    write_fake_opencode,
)
from tests.support.ci import required_in_ci

ROOT = Path(__file__).resolve().parents[2]
# A venv made by the system Python: any user can run it (the test's own may sit in /root).
VENV_PYTHON = SYSTEM_PYTHON

# One line per command (`probe_results`): its output's lines joined by " | ".
PROBE = """\
run() { name=$1; shift; out=$("$@" 2>&1); rc=$?; echo "$name $rc $(echo "$out" | paste -sd '|')"; }
run version crew --version
run help crew --help
"""


@dataclass(frozen=True)
class Checkout:
    """A checkout of the shim in `root` with a venv that finds it, as a developer's is."""

    root: Path

    @property
    def python(self) -> Path:
        return self.root / ".venv" / "bin" / "python"

    def interpreter_dirs(self) -> list[Path]:
        """What `RunDirectory.interpreter_dirs` grants when the Computer runs on this venv."""
        code = "import sys, crew_shim; print(sys.prefix); print(sys.base_prefix); "
        code += "print(crew_shim.__file__)"
        done = subprocess.run(
            [str(self.python), "-I", "-c", code], capture_output=True, text=True, check=True
        )
        prefix, base_prefix, shim = done.stdout.splitlines()
        dirs = [Path(prefix), Path(base_prefix), Path(shim).parent]
        return list(dict.fromkeys(d.resolve() for d in dirs))


def make_checkout(root: Path) -> Checkout:
    """`root` with `crew_shim/`, `crew_common/` and `.venv/`, whose `.pth` names `root`."""
    if not os.path.exists(VENV_PYTHON):
        required_in_ci(f"{VENV_PYTHON} (Debian package python3)")
    ignore = shutil.ignore_patterns("__pycache__")
    for package in ("crew_shim", "crew_common"):
        shutil.copytree(ROOT / package, root / package, ignore=ignore)
    subprocess.run(
        [VENV_PYTHON, "-m", "venv", "--without-pip", str(root / ".venv")],
        check=True,
        capture_output=True,
    )
    checkout = Checkout(root)
    done = subprocess.run(
        [str(checkout.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    (Path(done.stdout.strip()) / "__editable__.crew.pth").write_text(f"{root}\n")
    return checkout


def assert_crew_works(results: dict[str, tuple[int, str]], detail: object) -> None:
    assert results["help"][0] == 0 and "crew reply" in results["help"][1], detail
    assert results["version"] == (0, f"crew {VERSION}"), detail


# ---- the argv the launcher builds, both modes, root and unprivileged ----


@pytest.fixture(params=["caller", "unprivileged"])
def run_as(request: pytest.FixtureRequest, needs_bwrap: None) -> int:
    return probe_uid(request.param)


@pytest.fixture
def base() -> Iterator[Path]:
    with public_temp_dir("crew-shim-") as path:
        yield path


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", list(LinuxMode))
def test_crew_runs_in_the_sandbox_from_a_checkout(mode: LinuxMode, run_as: int, base: Path) -> None:
    home = base / "home"
    checkout = make_checkout(home / "src" / "crew")
    crew = home / ".crew"
    run = RunDirectory(crew, "r1", interpreter=str(checkout.python))
    run.prepare()
    agent, runtime = crew / "agents" / "a1", run.path / "agents" / "a1"
    for path in (agent / "work", runtime / "tmp", crew / "sockets"):
        path.mkdir(parents=True, mode=0o700)
    (agent / "probe.sh").write_text(PROBE)
    for path in [home, *home.rglob("*")]:
        os.lchown(path, run_as, run_as)
    policy = SandboxPolicy(
        home=home,
        crew_home=crew,
        agent_dir=agent,
        runtime_dir=runtime,
        tmp_dir=runtime / "tmp",
        work_dir=agent / "work",
        read_dirs=(run.bin_dir, *checkout.interpreter_dirs()),
    )
    argv = BwrapBackend(tools_for(run_as, 64), mode).argv(
        policy, ["/bin/sh", str(agent / "probe.sh")]
    )
    env = {
        "PATH": f"{run.bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(agent),
        "TMPDIR": str(runtime / "tmp"),
        "LANG": "C.UTF-8",
    }
    results = run_probe(argv, run_as, env, agent / "work")
    assert_crew_works(results, results)


# ---- through the real launcher process ----


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_crew_runs_in_a_launcher_run_from_a_checkout(
    mode: str, needs_bwrap: None, isolated_home: Path, tmp_path: Path
) -> None:
    layout = make_layout(isolated_home)
    checkout = make_checkout(isolated_home / "src" / "crew")
    RunDirectory(layout.crew_home, layout.run_id, interpreter=str(checkout.python)).prepare()
    layout.add_agent("alice")
    launcher = LauncherProcess(layout, write_fake_opencode(tmp_path / "engine-bin"), mode=mode)
    commands = {"version": ["crew", "--version"], "help": ["crew", "--help"]}
    body = layout.run_request(
        "alice",
        {"scenario": "commands", "commands": commands},
        interpreter_dirs=[str(d) for d in checkout.interpreter_dirs()],
    )
    try:
        lines = engine_lines(launcher.run(body))
    finally:
        _, err = launcher.stop()
    results = {x["check"]: (x["rc"], x["out"].strip()) for x in lines if "rc" in x}
    assert_crew_works(results, (lines, err[-2000:]))
