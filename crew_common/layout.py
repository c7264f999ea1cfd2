"""The on-disk layout of a crew home (computer.md §4): one definition for both services.

The Computer creates these directories; the launcher checks that a run
request names exactly them. Pure: computing paths, never creating them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Without this stub OpenCode forks `npm install @opencode-ai/plugin` into its
# config dir on every start (samples/opencode/REPORT.md §1).
NPM_STUB_LOCK = (
    b'{"lockfileVersion":3,"packages":{"":{"dependencies":{"@opencode-ai/plugin":"*"}}}}\n'
)


def run_dir(crew_home: Path, run_id: str) -> Path:
    """`runtime/<run-id>/`: what one run of the Computer creates and deletes at exit."""
    return crew_home / "runtime" / run_id


def bin_dir(crew_home: Path, run_id: str) -> Path:
    """`runtime/<run-id>/bin/`: the `crew` wrapper the agents call."""
    return run_dir(crew_home, run_id) / "bin"


@dataclass(frozen=True)
class AgentPaths:
    """Where one agent's files live (computer.md §4). Pure: computing, not creating."""

    crew_home: Path
    run_id: str
    agent_id: str

    @property
    def agent_dir(self) -> Path:
        return self.crew_home / "agents" / self.agent_id

    @property
    def agents_md(self) -> Path:
        return self.agent_dir / "AGENTS.md"

    @property
    def work_dir(self) -> Path:
        return self.agent_dir / "work"

    @property
    def memory_md(self) -> Path:
        return self.work_dir / "MEMORY.md"

    @property
    def engine_dir(self) -> Path:
        return self.agent_dir / "engines" / "opencode"

    @property
    def data_dir(self) -> Path:
        return self.engine_dir / "data"

    @property
    def session_file(self) -> Path:
        return self.engine_dir / "session.json"

    @property
    def run_dir(self) -> Path:
        return run_dir(self.crew_home, self.run_id)

    @property
    def bin_dir(self) -> Path:
        return bin_dir(self.crew_home, self.run_id)

    @property
    def runtime_dir(self) -> Path:
        return self.run_dir / "agents" / self.agent_id

    @property
    def token_file(self) -> Path:
        return self.runtime_dir / "token"

    @property
    def turn_file(self) -> Path:
        """The running turn's identity for its `crew` (`computer_service.turn_identity`)."""
        return self.runtime_dir / "turn"

    @property
    def config_dir(self) -> Path:
        return self.runtime_dir / "config"

    @property
    def cache_dir(self) -> Path:
        return self.runtime_dir / "cache"

    @property
    def state_dir(self) -> Path:
        return self.runtime_dir / "state"

    @property
    def tmp_dir(self) -> Path:
        return self.runtime_dir / "tmp"
