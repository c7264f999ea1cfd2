"""Fixtures of the browser tests: Debian's chromium through Playwright, the whole chain,
a signed-in page, axe-core, and the directory the screenshots go to.

Playwright's own browser download is not used (nor reachable here): the tests launch
the system's `chromium` (`CREW_CHROMIUM` overrides the path). Under CI=true a missing
chromium, Playwright or axe-core is a failure (tests/support/ci.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.chain import Chain, running_chain
from tests.support.ci import required_in_ci
from tests.web.site import anyio_backend, site  # noqa: F401  (fixtures of the in-process tests)

ROOT = Path(__file__).resolve().parents[2]
# scripts/setup installs axe-core from the npm registry here (tests only).
AXE = ROOT / ".venv" / "npm" / "node_modules" / "axe-core" / "axe.min.js"
SHOTS: list[Path] = []


def chromium_path() -> str | None:
    """The system chromium: `CREW_CHROMIUM`, else `chromium` on PATH."""
    configured = os.environ.get("CREW_CHROMIUM")
    if configured:
        return configured if Path(configured).exists() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass(frozen=True)
class Chromium:
    """Playwright's sync API and the system chromium it launches."""

    playwright: Any
    executable: str
    # --no-sandbox: the tests run as root, where Chromium's own sandbox refuses to start.
    args: tuple[str, ...] = ("--no-sandbox",)

    def persistent(self, profile: Path, **options: Any) -> Any:
        """A browser with a profile on disk (history and all), as a person's is."""
        return self.playwright.chromium.launch_persistent_context(
            str(profile), executable_path=self.executable, args=list(self.args), **options
        )


@pytest.fixture(scope="module")
def chromium() -> Iterator[Chromium]:
    """Playwright driving the system chromium, one per test module (Playwright's sync API
    runs an event loop while it is open, which the anyio tests of other modules cannot
    share)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        required_in_ci("Playwright for Python (the test extras: pip install -e '.[test]')")
    executable = chromium_path()
    if executable is None:
        required_in_ci("chromium (scripts/setup installs Debian's chromium)")
    assert executable is not None  # required_in_ci skipped or failed otherwise
    with sync_playwright() as playwright:
        yield Chromium(playwright, executable)


@pytest.fixture(scope="module")
def browser(chromium: Chromium) -> Iterator[Any]:
    """A headless system chromium (its contexts keep nothing on disk)."""
    launched = chromium.playwright.chromium.launch(
        executable_path=chromium.executable, args=list(chromium.args)
    )
    yield launched
    launched.close()


@pytest.fixture(scope="session")
def axe_source() -> str:
    """axe-core's script, run in the page for the accessibility checks."""
    if not AXE.exists():
        required_in_ci("axe-core (scripts/setup installs it into .venv/npm)")
    return AXE.read_text()


@pytest.fixture(scope="session")
def shots() -> Path:
    """Where the screenshots go: a temporary folder of their own, kept after the run (pytest
    prunes its own temp dirs, which other runs on the machine share) and printed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="crew-web-screenshots-"))
    SHOTS.append(folder)
    return folder


@pytest.fixture(scope="module")
def chain() -> Iterator[Chain]:
    """One whole chain (server, scripted model, Computer, OpenCode in bwrap) per module."""
    with running_chain() as started:
        yield started


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for folder in SHOTS:
        terminalreporter.write_line(f"web screenshots: {folder}")
