"""An in-process launcher app (no bwrap needed) for request-level tests."""

from __future__ import annotations

from pathlib import Path

from starlette.types import ASGIApp

from crew_common.launcher_wire import EngineHealth, SandboxHealth
from sandbox_launcher.app import create_app
from sandbox_launcher.backend import BwrapBackend
from sandbox_launcher.bwrap import BwrapTools, LinuxMode
from sandbox_launcher.launcher import Launcher, LauncherConfig
from tests.launcher.helpers import CrewLayout

SECRET = "in-process-secret-0123456789"
TOOLS = BwrapTools("/usr/bin/bwrap", "/usr/bin/env", "/usr/bin/python3", "/x/landlock_exec.py")


def inprocess_launcher(layout: CrewLayout, opencode: Path, ok: bool = True) -> Launcher:
    config = LauncherConfig(
        crew_home=layout.crew_home, home=layout.home, run_id=layout.run_id, opencode=opencode
    )
    health = SandboxHealth(
        ok=ok, backend="bwrap", mode="hybrid", reason=None if ok else "bwrap not found (test)"
    )
    return Launcher(
        config=config,
        backend=BwrapBackend(TOOLS, LinuxMode.HYBRID) if ok else None,
        sandbox=health,
        engine=EngineHealth(path=str(opencode), version="0.0.0-fake"),
    )


def inprocess_app(launcher: Launcher) -> ASGIApp:
    return create_app(launcher, SECRET)
