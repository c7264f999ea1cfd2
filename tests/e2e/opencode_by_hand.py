"""Running the real `opencode run` by hand (no Computer, no sandbox) against a model.

Shared by `test_scripted_model.py` and the turn benchmark's reference run.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[2]
OPENCODE = ROOT / "tools" / "opencode" / "node_modules" / ".bin" / "opencode"

# Without this stub every run forks a background `npm install` (REPORT.md §1).
NPM_STUB_LOCK = (
    b'{"lockfileVersion":3,"packages":{"":{"dependencies":{"@opencode-ai/plugin":"*"}}}}'
)


@dataclass(frozen=True)
class OpenCodeHome:
    """A throwaway HOME with its XDG directories and a work directory."""

    root: Path

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def work(self) -> Path:
        return self.root / "work"

    def xdg(self, kind: str) -> Path:
        return self.root / "xdg" / kind

    def prepare(self) -> OpenCodeHome:
        """Create the directories and the npm stub in the config dir."""
        for path in (
            self.home,
            self.work,
            *(self.xdg(k) for k in ("data", "config", "cache", "state")),
        ):
            path.mkdir(parents=True, exist_ok=True)
        oc_config = self.xdg("config") / "opencode"
        (oc_config / "node_modules").mkdir(parents=True, exist_ok=True)
        (oc_config / "package-lock.json").write_bytes(NPM_STUB_LOCK)
        return self

    def env(self, config: dict[str, Any]) -> dict[str, str]:
        """The environment of one hand-started run: nothing inherited but PATH and LANG."""
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(self.home),
            "XDG_DATA_HOME": str(self.xdg("data")),
            "XDG_CONFIG_HOME": str(self.xdg("config")),
            "XDG_CACHE_HOME": str(self.xdg("cache")),
            "XDG_STATE_HOME": str(self.xdg("state")),
            "PWD": str(self.work),
            "OPENCODE_CONFIG_CONTENT": orjson.dumps(config).decode(),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
        }


def scripted_config(provider: dict[str, Any], model: str = "local/scripted") -> dict[str, Any]:
    """An OpenCode config using only `provider`, every permission allowed."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "enabled_providers": sorted(provider),
        "model": model,
        "small_model": model,
        "provider": provider,
        "permission": {"*": "allow"},
    }


def opencode_argv(
    model: str = "local/scripted", session: str | None = None, title: str | None = "crew turn"
) -> list[str]:
    """The argv the Computer uses (computer.md §3), with a fixed title unless None."""
    argv = [str(OPENCODE), "run", "--pure", "--format", "json", "--print-logs", "--auto"]
    argv += ["--model", model]
    if title is not None:
        argv += ["--title", title]
    if session:
        argv += ["--session", session]
    return argv


@dataclass(frozen=True)
class RunOutput:
    code: int
    events: list[dict[str, Any]]
    stderr: str


def run_opencode(
    home: OpenCodeHome,
    config: dict[str, Any],
    prompt: str,
    *,
    session: str | None = None,
    title: str | None = "crew turn",
    timeout: float = 90,
) -> RunOutput:
    """Run one turn by hand and parse its stdout lines."""
    proc = subprocess.run(
        [*opencode_argv(config["model"], session, title), "--dir", str(home.work)],
        input=prompt.encode(),
        capture_output=True,
        cwd=home.work,
        env=home.env(config),
        timeout=timeout,
        check=False,
    )
    events = [orjson.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return RunOutput(proc.returncode, events, proc.stderr.decode(errors="replace"))
