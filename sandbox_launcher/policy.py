"""The sandbox policy of one run, independent of the platform backend.

Both backends (bwrap on Linux, Seatbelt on macOS) render the same
`SandboxPolicy`: writes only in the agent's own directories, file contents
below `$HOME` and the crew home unreadable except the allowlist, and the crew
sockets out of reach. Everything here is pure; paths arrive already checked
(`sandbox_launcher.paths`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from crew_common.secret_places import secret_overlap
from sandbox_launcher.paths import PathRefused, is_inside, resolved_dir

MAX_READ_DIRS = 32


@dataclass(frozen=True)
class SandboxPolicy:
    """What one sandboxed process may touch. All paths absolute, resolved, existing.

    `read_dirs` and `read_files` are readable in full even below a deny root
    (the run's `bin/`, the interpreter the shim needs, the engine's install).
    """

    home: Path
    crew_home: Path
    agent_dir: Path
    runtime_dir: Path
    tmp_dir: Path
    work_dir: Path
    read_dirs: tuple[Path, ...] = ()
    read_files: tuple[Path, ...] = ()
    # `.git` directories in the work dir whose hooks and config stay read-only
    # (`sandbox_launcher.git_guard`); each has a real `hooks/` and `config`.
    guarded_git: tuple[Path, ...] = ()

    @property
    def sockets_dir(self) -> Path:
        """Where the Computer's and the launcher's sockets live: hidden in every sandbox."""
        return self.crew_home / "sockets"

    @property
    def deny_roots(self) -> tuple[Path, ...]:
        """Below these, file contents are unreadable except the allowlist."""
        if is_inside(self.crew_home, self.home):
            return (self.home,)
        if is_inside(self.home, self.crew_home):
            return (self.crew_home,)
        return (self.home, self.crew_home)

    @property
    def writable_dirs(self) -> tuple[Path, ...]:
        """The agent's persistent dir and its runtime dir (the temp dir lies inside it)."""
        dirs = [self.agent_dir, self.runtime_dir]
        if not any(is_inside(self.tmp_dir, d) for d in dirs):
            dirs.append(self.tmp_dir)
        return tuple(dirs)


def check_read_dir(
    text: str, home: Path, crew_home: Path, what: str = "interpreter_dirs entry"
) -> Path:
    """Check one directory a run wants readable (an interpreter, a toolchain, a read-only root).

    It must be a real directory with no symlinked level (the caller resolves
    it first), and must not contain `$HOME`, overlap the crew home (other
    agents' tokens live there) or overlap a secret place of `$HOME`
    (`crew_common.secret_places`).
    """
    path = resolved_dir(text, what)
    why = secret_overlap(path, home, crew_home)
    if why is not None:
        raise PathRefused(f"{what}: {path} is never readable in a sandbox: {why}")
    return path
