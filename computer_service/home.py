"""Agent home directories (computer.md §4).

`AgentHome` prepares one agent: its persistent directory (AGENTS.md, `work/`
with a MEMORY.md template, the engine's data dir, whose `session.json` is
`engine/session.py`'s) and its runtime directory for this run (token,
OpenCode config/cache/state/tmp, the npm stub). Every file operation goes
through `safe_fs`, since the agent can write both of its directories from
inside the sandbox.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from computer_service import safe_fs
from computer_service.safe_fs import UnsafePath
from computer_service.texts import (
    MEMORY_TEMPLATE,
    AgentIdentity,
    render_agents_md,
    render_turn_input,
)
from crew_common.layout import NPM_STUB_LOCK, AgentPaths

log = logging.getLogger(__name__)

# What may stay in the engine's global config directory (`_clear_engine_config`).
ENGINE_CONFIG_KEPT = frozenset({"package-lock.json", "node_modules", ".gitignore"})


class AgentHomeError(Exception):
    """Preparing an agent's directories failed; the message says why and what to do."""


def local_now() -> datetime:
    """The current time in the machine's zone, aware."""
    return datetime.now().astimezone()


class AgentHome:
    """One agent's directories and texts, for one run of the Computer.

    Satisfies the runner's `AgentWorkspace`: `agents_md`, `repair`,
    `render_input`.
    """

    def __init__(
        self,
        paths: AgentPaths,
        agent: AgentIdentity,
        *,
        clock: Callable[[], datetime] = local_now,
    ) -> None:
        self.paths = paths
        self.agent = agent
        self._clock = clock
        self._agents_md = render_agents_md(agent)
        # Kept to rewrite the token file should the agent delete it (set by `prepare`).
        self._token = ""

    @property
    def agents_md(self) -> str:
        """The AGENTS.md text for this agent's settings."""
        return self._agents_md

    def prepare(self, token: str) -> None:
        """Create the agent's directories and files; raise `AgentHomeError` with a reason.

        Directories are 0700 and files 0600, every level checked (`repair`
        says what is fixed and what is refused). Writes the token, AGENTS.md,
        the npm stub, and the MEMORY.md template when `work/MEMORY.md` does not
        exist at all.
        """
        p = self.paths
        self._token = token
        try:
            self._restore_dirs()
            self._clear_engine_config()
            for path, data in self._files():
                safe_fs.write_file_atomic(p.crew_home, path, data)
            # An existing MEMORY.md is the agent's, whatever it is (even a FIFO).
            if safe_fs.lstat_entry(p.crew_home, p.memory_md) is None:
                safe_fs.write_file_atomic(p.crew_home, p.memory_md, MEMORY_TEMPLATE.encode())
        except (UnsafePath, OSError) as exc:
            raise AgentHomeError(self._cannot_prepare(exc)) from exc

    def repair(self) -> str | None:
        """Before every turn: put back what the agent broke of the Computer's; else the reason.

        The agent can write both of its directories, so one `rm -rf` may take
        `work/` or its temp dir, or leave a symlink where a directory belongs.
        Missing directories are recreated and data-less entries in their place
        (symlinks, FIFOs, sockets) removed; the token, AGENTS.md and the npm
        stub are rewritten when they are not regular files. A regular file
        where a directory belongs is not deleted (it may be the agent's work):
        that is the returned reason. Cheap when all is well: an lstat and an
        openat per level.
        """
        p = self.paths
        try:
            repaired = self._restore_dirs()
            repaired += self._clear_engine_config()
            for path, data in self._files():
                st = safe_fs.lstat_entry(p.crew_home, path)
                if st is None or not stat.S_ISREG(st.st_mode):
                    safe_fs.write_file_atomic(p.crew_home, path, data)
                    repaired.append(f"{_relative_path(path, p)} was rewritten")
        except (UnsafePath, OSError) as exc:
            return self._cannot_prepare(exc)
        if repaired:
            log.warning(
                "agent %s: repaired its directories before the turn: %s",
                self.agent.handle,
                "; ".join(repaired),
            )
        return None

    def _restore_dirs(self) -> list[str]:
        """The agent's directories and its runtime directories, as `safe_fs.restore_dirs` makes them."""
        p = self.paths
        agent_dirs = [p.work_dir, p.data_dir]
        runtime_dirs = [
            p.config_dir / "opencode" / "node_modules",
            p.cache_dir,
            p.state_dir,
            p.tmp_dir,
        ]
        repaired = safe_fs.restore_dirs(
            p.crew_home, p.agent_dir, [d.relative_to(p.agent_dir) for d in agent_dirs]
        )
        repaired += safe_fs.restore_dirs(
            p.crew_home, p.runtime_dir, [d.relative_to(p.runtime_dir) for d in runtime_dirs]
        )
        return repaired

    def _clear_engine_config(self) -> list[str]:
        """Empty OpenCode's global config directories of everything the Computer did not put there.

        OpenCode reads them at every start, `--pure` too: custom tools in `tools/`
        are imported into the engine process, plugins and a `shell` setting in an
        `opencode.json` are taken. The agent can write both (`$XDG_CONFIG_HOME/opencode`
        in its runtime directory, `$HOME/.opencode` in its own), so code it put
        there would run as its next engine, outside its tools' Landlock domain.
        Kept: the npm stub and the `.gitignore` OpenCode writes itself.
        """
        p = self.paths
        config = p.config_dir / "opencode"
        removed = []
        with safe_fs.open_dir(p.crew_home, config) as dfd:
            names = os.listdir(dfd)
        for name in sorted(set(names) - ENGINE_CONFIG_KEPT):
            safe_fs.remove_tree(p.crew_home, config / name)
            removed.append(f"{_relative_path(config / name, p)} was removed")
        with safe_fs.open_dir(p.crew_home, config / "node_modules") as dfd:
            if os.listdir(dfd):
                safe_fs.clear_dir(p.crew_home, config / "node_modules")
                removed.append(f"{_relative_path(config / 'node_modules', p)} was emptied")
        dot = p.agent_dir / ".opencode"
        if safe_fs.lstat_entry(p.crew_home, dot) is not None:
            safe_fs.remove_tree(p.crew_home, dot)
            removed.append(f"{_relative_path(dot, p)} was removed")
        return [f"{r} (OpenCode would load code from it)" for r in removed]

    def _files(self) -> list[tuple[Path, bytes]]:
        """The files the Computer writes for this agent, with their content."""
        p = self.paths
        return [
            (p.token_file, self._token.encode("utf-8")),
            (p.agents_md, self._agents_md.encode("utf-8")),
            (p.config_dir / "opencode" / "package-lock.json", NPM_STUB_LOCK),
        ]

    def _cannot_prepare(self, exc: BaseException) -> str:
        return (
            f"cannot prepare the directories of agent @{self.agent.handle}: "
            f"{_relative(exc, self.paths)}"
        )

    def memory_size(self) -> int | None:
        """MEMORY.md's size in bytes; None when missing or not a regular file."""
        try:
            st = safe_fs.lstat_entry(self.paths.crew_home, self.paths.memory_md)
        except UnsafePath as exc:
            log.warning("agent %s: cannot look at MEMORY.md: %s", self.paths.agent_id, exc)
            return None
        return st.st_size if st is not None and stat.S_ISREG(st.st_mode) else None

    def render_input(self, rooms: Sequence[Any], new_session: bool) -> str:
        """The turn input for these unread rooms, stamped with the local time now."""
        size = self.memory_size() if new_session else None
        return render_turn_input(self._clock(), rooms, self.agent, new_session, size)


def _relative_path(path: Path, paths: AgentPaths) -> str:
    return str(path.relative_to(paths.crew_home))


def _relative(exc: BaseException, paths: AgentPaths) -> str:
    """The error text with the crew home path taken out (reasons go to the server)."""
    return str(exc).replace(str(paths.crew_home) + "/", "").replace(str(paths.crew_home), "~crew")


def skills_root(paths: AgentPaths) -> Path:
    """Where the Computer writes the agent's skills (issue 27): its runtime directory,
    outside OpenCode's config directories (`_clear_engine_config` empties those)."""
    return paths.runtime_dir / "skills"


def write_skills(paths: AgentPaths, files: Sequence[tuple[PurePosixPath, bytes]]) -> Path | None:
    """Write the agent's skill files into a directory named by their digest; the directory
    (None: no skills). Other skill directories are removed.

    Named by content so that a changed skill changes the engine's config (`skills.paths`),
    and so its warm server: OpenCode reads skills once per server. Unchanged ones are
    not written again (an lstat of the SKILL.md files). Raises `UnsafePath` or `OSError`.
    """
    root = skills_root(paths)
    digest = hashlib.sha256()
    for rel, data in files:
        digest.update(str(rel).encode() + b"\0" + hashlib.sha256(data).digest())
    target = root / digest.hexdigest()[:16] if files else None
    crew_home = paths.crew_home
    if safe_fs.lstat_entry(crew_home, root) is not None:
        with safe_fs.open_dir(crew_home, root) as dfd:
            names = os.listdir(dfd)
        for name in names:
            if target is None or name != target.name:
                safe_fs.remove_tree(crew_home, root / name)
    if target is None:
        return None
    present = all(
        (st := safe_fs.lstat_entry(crew_home, target / rel)) is not None
        and stat.S_ISREG(st.st_mode)
        and st.st_size == len(data)
        for rel, data in files
    )
    if not present:
        for rel, data in files:
            safe_fs.write_file_atomic(crew_home, target / rel, data)
    return target
