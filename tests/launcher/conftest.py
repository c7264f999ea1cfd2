"""Fixtures of the launcher tests: a crew home in the temporary HOME, a fake engine, a real launcher."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launcher.helpers import CrewLayout, LauncherProcess, make_layout, write_fake_opencode
from tests.support.ci import required_in_ci

MODES = ["hybrid", "tmpfs"]


@pytest.fixture
def needs_bwrap() -> None:
    """Real sandbox runs need Linux with bwrap (and Landlock for hybrid)."""
    if not sys.platform.startswith("linux") or not os.path.exists("/usr/bin/bwrap"):
        required_in_ci("bwrap (Debian package bubblewrap)")


@pytest.fixture
def layout(isolated_home: Path) -> CrewLayout:
    return make_layout(isolated_home)


@pytest.fixture
def fake_opencode(tmp_path: Path) -> Path:
    return write_fake_opencode(tmp_path / "engine-bin")


@pytest.fixture(params=MODES)
def launcher(
    request: pytest.FixtureRequest, needs_bwrap: None, layout: CrewLayout, fake_opencode: Path
) -> Iterator[LauncherProcess]:
    """A real launcher in each Linux mode, with the fake engine as its opencode."""
    proc = LauncherProcess(layout, fake_opencode, mode=request.param)
    try:
        yield proc
    finally:
        proc.stop()
