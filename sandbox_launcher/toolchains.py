"""The user's toolchains under `$HOME`: readable and executable in every sandbox (issue 11).

Most developers' `PATH` has entries in their home (pyenv shims, nvm,
`~/.local/bin`, `~/.cargo/bin`); below `$HOME` file contents are denied, so an
agent got "Permission denied" running them. At start the launcher turns the
`PATH` it was given into read roots:

- each `PATH` entry under `$HOME` (or the crew home), resolved; when it is a
  `bin`/`shims` directory, the toolchain root above it (`~/.pyenv/shims` →
  `~/.pyenv`, `~/.nvm/versions/node/v20/bin` → `…/v20`), unless that root
  holds a secret place (`~/.local/bin` stays just itself: `~/.local` holds
  `~/.local/share/keyrings`);
- what the entry's programs resolve into: symlinks (`~/.local/bin/x` →
  `~/.pyenv/versions/3.11.9/bin/x` grants `~/.pyenv/versions/3.11.9`) and the
  interpreters of `#!` scripts;
- rustup's home for a `~/.cargo/bin` with rustup's proxies in it (the proxies
  run the toolchains kept there); the engine gets `RUSTUP_HOME`, since its own
  `HOME` is the agent's directory.

Never a secret place (`crew_common.secret_places`): an entry or root that is,
contains or lies inside one is refused, logged once and shown in `/health`.
The user's `read_only_roots` go through the same check (`read_only_roots`).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_launcher.paths import PathRefused, is_inside
from sandbox_launcher.policy import check_read_dir

log = logging.getLogger(__name__)

TOOL_DIR_NAMES = ("bin", "sbin", "shims")
MAX_ENTRIES_PER_DIR = 4096  # programs looked at per PATH entry (a huge ~/bin is cut short)
SHEBANG_BYTES = 256


@dataclass
class ReadRoots:
    """Directories every sandbox may read, and what was refused (with why)."""

    dirs: list[Path] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    rustup_home: Path | None = None

    def add(self, path: Path, home: Path, crew_home: Path, what: str) -> bool:
        """Grant `path` unless refused; a refusal is recorded once. True when granted."""
        try:
            checked = check_read_dir(str(path), home, crew_home, what)
        except PathRefused as exc:
            reason = str(exc)
            if reason not in self.refused:
                self.refused.append(reason)
            return False
        if not self.covers(checked):
            self.dirs = [d for d in self.dirs if not is_inside(d, checked)] + [checked]
        return True

    def covers(self, path: Path) -> bool:
        """True when `path` lies in a granted directory."""
        return any(is_inside(path, d) for d in self.dirs)


def _below(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(is_inside(path, r) for r in roots)


def _toolchain_root(directory: Path, home: Path) -> Path:
    """`…/v20/bin` → `…/v20`; any other directory is its own root. Never `$HOME` itself."""
    if directory.name in TOOL_DIR_NAMES and directory.parent != home and directory != home:
        return directory.parent
    return directory


def _grant_root(found: ReadRoots, directory: Path, home: Path, crew: Path, what: str) -> bool:
    """Grant the toolchain root of `directory`, else (a secret below that root) `directory`."""
    root = _toolchain_root(directory, home)
    if root != directory:
        try:
            check_read_dir(str(root), home, crew, what)
        except PathRefused:
            root = directory
    return found.add(root, home, crew, what)


def _interpreter(path: Path) -> str | None:
    """The absolute interpreter of a `#!` script (not `/usr/bin/env NAME`), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        head = os.read(fd, SHEBANG_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    return words[0] if words and words[0].startswith("/") else None


def _targets(directory: Path) -> list[Path]:
    """Where the programs of `directory` lead: symlink targets and `#!` interpreters, resolved."""
    found: list[Path] = []
    try:
        with os.scandir(directory) as listing:
            entries = [e for _, e in zip(range(MAX_ENTRIES_PER_DIR), listing, strict=False)]
    except OSError as exc:
        log.warning("cannot list %s: %s", directory, exc)
        return found
    for entry in entries:
        try:
            if entry.is_symlink():
                found.append(Path(os.path.realpath(entry.path)))
            elif entry.is_file(follow_symlinks=False):
                interpreter = _interpreter(Path(entry.path))
                if interpreter is not None:
                    found.append(Path(os.path.realpath(interpreter)))
        except OSError:
            continue
    return found


def _rustup_home(directory: Path, environ: Mapping[str, str], home: Path) -> Path | None:
    """Rustup's home when `directory` holds rustup's proxies (`rustup` next to `cargo`)."""
    if not (directory / "rustup").is_file():
        return None
    text = environ.get("RUSTUP_HOME") or str(home / ".rustup")
    real = Path(os.path.realpath(text))
    return real if real.is_dir() else None


def toolchain_roots(
    path_var: str, home: Path, crew_home: Path, environ: Mapping[str, str]
) -> ReadRoots:
    """The read roots of the `PATH` entries under `$HOME` or the crew home (module doc)."""
    found = ReadRoots()
    private = (home, crew_home)
    for entry in dict.fromkeys(path_var.split(":")):
        if not entry.startswith("/"):
            continue  # "" and relative entries mean the cwd: never a toolchain
        real = Path(os.path.realpath(entry))
        if not _below(real, private) or not real.is_dir():
            continue
        what = f"PATH entry {entry}"
        if not _grant_root(found, real, home, crew_home, what):
            continue
        for target in _targets(real):
            if _below(target, private) and not found.covers(target):
                _grant_root(found, target.parent, home, crew_home, f"{what} (via {target})")
        rustup = _rustup_home(real, environ, home)
        if rustup is not None and _below(rustup, private):
            if found.add(rustup, home, crew_home, f"rustup's home for {what}"):
                found.rustup_home = rustup
        elif rustup is not None:
            found.rustup_home = rustup
    for reason in found.refused:
        log.warning("not readable by agents: %s", reason)
    return found


def read_only_roots(texts: list[str], home: Path, crew_home: Path) -> ReadRoots:
    """The user's `read_only_roots` (a repository the agents may read), each checked."""
    found = ReadRoots()
    for text in texts:
        real = Path(os.path.realpath(text))
        try:
            mode = os.stat(real).st_mode
        except OSError as exc:
            found.refused.append(f"read_only_roots entry {text}: {exc.strerror}")
            continue
        if not stat.S_ISDIR(mode):
            found.refused.append(f"read_only_roots entry {text}: not a directory")
            continue
        found.add(real, home, crew_home, "read_only_roots entry")
    for reason in found.refused:
        log.warning("not readable by agents: %s", reason)
    return found
