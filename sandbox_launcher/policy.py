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

from sandbox_launcher.paths import PathRefused, is_inside, resolved_dir

# Places in $HOME that hold credentials. An allowed read directory may not
# contain one of them, nor lie inside one (so `~/.local` or `~/.config` are
# refused as "interpreter directories", `~/.local/share/pipx/venvs/x` is fine).
SECRET_ANCHORS = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".netrc",
    ".password-store",
    ".mozilla",
    ".config/gh",
    ".config/gcloud",
    ".config/opencode",
    ".local/share/opencode",
    ".local/share/keyrings",
)
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


def check_read_dir(text: str, home: Path, crew_home: Path) -> Path:
    """Check one interpreter/package directory a run wants readable.

    It must be a real directory with no symlinked level (the client resolves
    it first), must not be or contain `$HOME` or the crew home, must not lie
    inside the crew home (other agents' tokens live there) and must not
    overlap a credential store in `$HOME` (`SECRET_ANCHORS`).
    """
    what = "interpreter_dirs entry"
    path = resolved_dir(text, what)
    for root, name in ((home, "$HOME"), (crew_home, "the crew home")):
        if is_inside(root, path):
            raise PathRefused(
                f"{what} {path} contains {name}; name the interpreter's own directory"
            )
    if is_inside(path, crew_home):
        raise PathRefused(f"{what} {path} lies inside the crew home; that is never readable")
    for anchor in SECRET_ANCHORS:
        secret = home / anchor
        if is_inside(secret, path) or is_inside(path, secret):
            raise PathRefused(f"{what} {path} overlaps the credential store {secret}")
    return path
