"""Agent home directories (computer.md §4).

`AgentHome` prepares one agent: its persistent directory (AGENTS.md, `work/`
with a MEMORY.md template, the engine's data dir and `session.json`) and its
runtime directory for this run (token, OpenCode config/cache/state/tmp, the
npm stub). Every file operation goes through `safe_fs`, since the agent can
write both of its directories from inside the sandbox.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from computer_service import safe_fs
from computer_service.engine.base import SessionPlan
from computer_service.safe_fs import UnsafePath
from computer_service.texts import (
    MEMORY_TEMPLATE,
    AgentIdentity,
    render_agents_md,
    render_turn_input,
)
from crew_common.layout import NPM_STUB_LOCK, AgentPaths

log = logging.getLogger(__name__)

ENGINE_NAME = "opencode"
SESSION_FILE_LIMIT = 64 * 1024
# The session ids a run request may carry (the launcher's SESSION_PATTERN): the agent can
# edit session.json, and an id the launcher refuses would fail every turn from then on.
SESSION_ID = re.compile(r"ses_[A-Za-z0-9]{1,100}")
PRICE_TABLE_LIMIT = 32 * 1024 * 1024


# What may stay in the engine's global config directory (`_clear_engine_config`).
ENGINE_CONFIG_KEPT = frozenset({"package-lock.json", "node_modules", ".gitignore"})


class AgentHomeError(Exception):
    """Preparing an agent's directories failed; the message says why and what to do."""


@dataclass(frozen=True)
class SessionRecord:
    """The content of `engines/opencode/session.json`."""

    engine: str
    model: str
    agents_md_digest: str
    session_id: str

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "engine": self.engine,
                "model": self.model,
                "agents_md_sha256": self.agents_md_digest,
                "session_id": self.session_id,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> SessionRecord | None:
        """Parse a record; None for anything malformed (the agent may have edited it)."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(obj, dict):
            return None
        fields = [obj.get(k) for k in ("engine", "model", "agents_md_sha256", "session_id")]
        if not all(isinstance(f, str) and f for f in fields):
            return None
        engine, model, digest, session_id = (str(f) for f in fields)
        if not SESSION_ID.fullmatch(session_id):
            return None
        return cls(engine, model, digest, session_id)


def agents_md_digest(agents_md: str) -> str:
    """The digest that ties a saved session to the AGENTS.md it started with."""
    return hashlib.sha256(agents_md.encode("utf-8")).hexdigest()


def plan_session(
    record: SessionRecord | None, engine: str, model: str, agents_md: str
) -> SessionPlan:
    """Continue the saved session only when engine, model and AGENTS.md are all unchanged."""
    if (
        record is not None
        and record.engine == engine
        and record.model == model
        and record.agents_md_digest == agents_md_digest(agents_md)
    ):
        return SessionPlan(record.session_id)
    return SessionPlan(None)


def read_session_record(paths: AgentPaths) -> SessionRecord | None:
    """The saved session of an agent; None when missing, malformed or not a regular file."""
    try:
        data = safe_fs.read_regular_file(paths.crew_home, paths.session_file, SESSION_FILE_LIMIT)
    except UnsafePath as exc:
        log.warning("agent %s: ignoring the saved session: %s", paths.agent_id, exc)
        return None
    return None if data is None else SessionRecord.from_json(data)


def write_session_record(paths: AgentPaths, record: SessionRecord) -> None:
    """Save the session record (temp file + rename, 0600). Raises `UnsafePath`."""
    safe_fs.write_file_atomic(paths.crew_home, paths.session_file, record.to_json())


def local_now() -> datetime:
    """The current time in the machine's zone, aware."""
    return datetime.now().astimezone()


class AgentHome:
    """One agent's directories and texts, for one run of the Computer.

    Satisfies the runner's `AgentWorkspace`: `agents_md`, `repair`,
    `render_input`, `save_session`.
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

    def save_session(self, session_id: str, model: str) -> None:
        """Record the session to continue next turn; raises `AgentHomeError` on failure."""
        record = SessionRecord(ENGINE_NAME, model, agents_md_digest(self._agents_md), session_id)
        try:
            write_session_record(self.paths, record)
        except (UnsafePath, OSError) as exc:
            raise AgentHomeError(
                f"cannot save the session of agent @{self.agent.handle}: {_relative(exc, self.paths)}"
            ) from exc

    def copy_price_table(self, source: Path) -> bool:
        """Copy the user's OpenCode price table into this agent's cache dir (see below)."""
        return copy_price_table(self.paths, source)


def copy_price_table(paths: AgentPaths, source: Path) -> bool:
    """Copy the user's OpenCode price table into the agent's cache dir when newer.

    Returns True when copied. Never raises: a failed copy only costs the turn
    its prices (cost 0), so it is logged and the turn goes on.
    """
    dest = paths.cache_dir / "opencode" / "models.json"
    try:
        return safe_fs.copy_if_newer(source, paths.crew_home, dest, PRICE_TABLE_LIMIT)
    except (UnsafePath, OSError) as exc:
        log.warning(
            "agent %s: price table not copied (costs will read 0): %s",
            paths.agent_id,
            _relative(exc, paths),
        )
        return False


def _relative_path(path: Path, paths: AgentPaths) -> str:
    return str(path.relative_to(paths.crew_home))


def _relative(exc: BaseException, paths: AgentPaths) -> str:
    """The error text with the crew home path taken out (reasons go to the server)."""
    return str(exc).replace(str(paths.crew_home) + "/", "").replace(str(paths.crew_home), "~crew")
