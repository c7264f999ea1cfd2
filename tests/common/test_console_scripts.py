"""Every console script answers `--version` and `--help` at once, and a usage error without a traceback."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from crew_common.version import VERSION
from crew_shim.version import VERSION as SHIM_VERSION

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ("crew-computer", "crew-launcher", "crew", "crew-server")

pytestmark = pytest.mark.timeout(60)


def script(name: str) -> Path:
    """The installed console script, next to this interpreter (scripts/setup installs them)."""
    path = Path(sys.executable).parent / name
    assert path.exists(), f"{path} is missing: run scripts/setup"
    return path


def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    # stdin is an empty pipe: a script that waited for input would see EOF, not hang.
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=30, stdin=subprocess.PIPE
    )


def test_the_version_is_the_packages() -> None:
    """pyproject.toml's version, and its two copies: the shim's stands alone in the sandbox."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == VERSION == SHIM_VERSION
    assert set(SCRIPTS) == set(project["scripts"])


@pytest.mark.parametrize("name", SCRIPTS)
def test_version(name: str) -> None:
    done = run(script(name), "--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{name} {VERSION}\n", "")


@pytest.mark.parametrize("name", SCRIPTS)
def test_help(name: str) -> None:
    done = run(script(name), "--help")
    assert done.returncode == 0, done.stderr
    assert name in done.stdout and done.stderr == ""


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("crew-computer", ["frobnicate"]),
        ("crew-computer", ["run"]),
        ("crew-computer", ["--no-such-option"]),
        ("crew-launcher", ["serve"]),
        ("crew-server", ["--port", "eighty"]),
        ("crew-server", ["--db", "x.db", "--log-level", "loud"]),
    ],
)
def test_usage_errors_exit_2_without_a_traceback(name: str, argv: list[str]) -> None:
    done = run(script(name), *argv)
    assert done.returncode == 2, done.stderr
    assert "usage:" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["run"], "usage: crew-computer run [-h] --config FILE\n"),
        (
            ["status", "--crew-home"],
            "usage: crew-computer status [-h] [--json] [--crew-home DIR]\n",
        ),
        (["follow", "--crew-home"], "usage: crew-computer follow [-h] [--crew-home DIR] [AGENT]\n"),
    ],
)
def test_a_subcommands_usage_is_its_own(argv: list[str], usage: str) -> None:
    """Not the top-level usage glued in front of it (a new user saw four lines of it)."""
    done = run(script("crew-computer"), *argv)
    assert done.returncode == 2
    assert done.stderr.startswith(usage), done.stderr
    assert "< bootstrap.json" not in done.stderr


def test_the_help_names_every_bootstrap_field() -> None:
    from computer_service.bootstrap import Bootstrap

    done = run(script("crew-computer"), "--help")
    words = set(done.stdout.replace(",", " ").split())
    assert set(Bootstrap.model_fields) <= words, set(Bootstrap.model_fields) - words
    assert "token_file" in done.stdout
