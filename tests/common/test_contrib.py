"""`contrib/`: the systemd user unit, the launchd agent and the example config are valid
and start `crew-computer run --config FILE` (with a command line the real parser takes)."""

from __future__ import annotations

import configparser
import os
import plistlib
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from computer_service.__main__ import LOG_LEVELS, parser
from computer_service.bootstrap import load_config
from tests.support.ci import required_in_ci

ROOT = Path(__file__).resolve().parents[2]
CONTRIB = ROOT / "contrib"
UNIT = CONTRIB / "crew-computer.service"
PLIST = CONTRIB / "com.crew.computer.plist"


def unit_sections() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # keys are case-sensitive
    unit.read_string(UNIT.read_text())
    return unit


def assert_runs_with_a_config(argv: list[str], config: str) -> None:
    assert Path(argv[0]).name == "crew-computer"
    args = parser().parse_args(argv[1:])
    assert (args.command, str(args.config)) == ("run", config)


def test_the_unit_runs_crew_computer_with_a_config_and_stops_it_with_sigterm() -> None:
    unit = unit_sections()
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert_runs_with_a_config(argv, "%h/.config/crew/computer.json")
    # Only the Computer gets SIGTERM: it stops its turns and its launcher in order.
    assert (service["KillMode"], service["KillSignal"]) == ("mixed", "SIGTERM")
    assert service["Restart"] == "on-failure"
    assert unit["Install"]["WantedBy"] == "default.target"


@pytest.mark.timeout(60)
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        # scripts/setup installs it (Debian's systemd); elsewhere (macOS) the INI test ran.
        required_in_ci("systemd-analyze (apt-get install systemd)")
    # %h is this HOME: put the installed console script where the unit expects it.
    bin_dir = tmp_path / ".local" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "crew-computer").symlink_to(Path(sys.executable).parent / "crew-computer")
    done = subprocess.run(
        [analyze, "verify", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=50,
        env=os.environ | {"HOME": str(tmp_path)},
    )
    # It exits 0 even for an unknown key or a bad value: its warnings are the verdict.
    assert (done.returncode, done.stderr) == (0, ""), done.stderr


def test_the_launchd_agent_runs_crew_computer_with_a_config() -> None:
    with PLIST.open("rb") as file:
        agent = plistlib.load(file)
    assert agent["Label"] == PLIST.name.removesuffix(".plist")
    assert_runs_with_a_config(
        agent["ProgramArguments"], "/Users/USERNAME/.config/crew/computer.json"
    )
    assert agent["RunAtLoad"] is True
    assert agent["KeepAlive"] == {"SuccessfulExit": False}  # restart after failures only
    assert agent["Umask"] == 0o077
    # The README's sed puts the home in: every path must be under the placeholder.
    paths = [*agent["ProgramArguments"], agent["StandardErrorPath"], agent["StandardOutPath"]]
    assert all(p.startswith("/Users/USERNAME/") for p in paths if p.startswith("/"))


def test_the_example_config_loads(tmp_path: Path) -> None:
    config = tmp_path / "computer.json"
    shutil.copy(CONTRIB / "computer.example.json", config)
    (tmp_path / "computer.token").write_text("crc_example\n")
    (tmp_path / "computer.token").chmod(0o600)
    boot = load_config(config, {})
    assert boot.token == "crc_example"
    assert boot.server_url.startswith("http")


def test_the_readme_says_how_to_run_it_with_these_files() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Running it for real", 1)[1].split("\n## ", 1)[0]
    for step in ("Install", "Configure", "Start at login", "Watch", "Stop", "Upgrade"):
        assert f"**{step}.**" in section
    for path in CONTRIB.iterdir():
        assert f"contrib/{path.name}" in section, path.name
    assert "crew-computer run --config" in section
    log_level = next(line for line in readme.splitlines() if line.startswith("| `CREW_LOG_LEVEL`"))
    assert all(f"`{level}`" in log_level for level in LOG_LEVELS)
