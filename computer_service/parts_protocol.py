"""`Parts`: what the service asks of the machine (launcher, directories, engine).

The service decides *when*; an implementation of `Parts` knows *how*. The
real one is `computer_service.parts.LocalParts`; tests and benchmarks swap in
their own. Both sides import this module, never each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from computer_service.engine.base import Engine
from computer_service.engine.user_opencode import unsupported_opencode
from computer_service.runner import AgentWorkspace
from computer_service.upstream import AgentRecord


class StartupFailed(Exception):
    """The Computer cannot start or go on (computer.md §1 steps 1, 4–6); exit 1 with this line."""


class ModelsFailed(Exception):
    """`opencode models` gave no list (it failed or took over 30 s): this run cannot go on."""


class AgentPreparationFailed(Exception):
    """One agent's directory or credential could not be prepared (reported for that agent)."""


@dataclass(frozen=True)
class LauncherStatus:
    """What the launcher's `/health` says (or why there is no launcher)."""

    sandbox_ok: bool | None
    backend: str | None
    reason: str | None
    engine_found: bool
    engine_version: str | None
    # Toolchains on PATH and read_only_roots the launcher refused as secret places.
    not_granted: tuple[str, ...] = ()
    # "namespace" (Linux: each sandbox its own) or "shared" (macOS: the host's).
    network: str | None = None

    def unavailable_reason(self) -> str | None:
        """Why no agent can run, or None when the sandbox and the engine are usable."""
        if self.sandbox_ok is None:
            return "starting"
        if not self.sandbox_ok:
            return f"sandbox unavailable: {self.reason or 'the self-test failed'}"
        engine = self.engine_reason()
        return f"engine unavailable: {engine}" if engine else None

    def engine_reason(self) -> str | None:
        """Why the engine cannot run agents (not found, an unsupported OpenCode), or None."""
        if self.sandbox_ok is None:
            return None
        if not self.engine_found:
            return "opencode not found (install OpenCode or set opencode_path)"
        return unsupported_opencode(self.engine_version)


class Parts(Protocol):
    """The machine-facing parts the service drives (real: `LocalParts`)."""

    async def start_launcher(self) -> LauncherStatus:
        """Start the launcher and read its health; a launcher that cannot start is `ok: false`."""
        ...

    async def stop_launcher(self) -> None: ...

    async def launcher_exited(self) -> int:
        """Wait until the launcher dies on its own (never returns while there is none)."""
        ...

    async def models(self) -> list[str]:
        """`opencode models` through the launcher: the `provider/model` lines.

        Raises `ModelsFailed` when opencode itself gives no list; any other
        error (the launcher being replaced) is worth a retry.
        """
        ...

    def prepare_run_dir(self) -> None:
        """Clean `runtime/*`, create `runtime/<run-id>/`, write `bin/crew` (raises on failure)."""
        ...

    def remove_run_dir(self) -> None: ...

    def engine(self) -> Engine:
        """The engine runners use (only called when the launcher is usable)."""
        ...

    def prepare_agent(self, agent: AgentRecord, token: str) -> AgentWorkspace:
        """Create the agent's directories, token file and AGENTS.md (`AgentPreparationFailed`)."""
        ...
