"""Path checks for everything a run request names: absolute, normal, no symlinks.

bwrap follows symlinks in bind sources, so one planted link (say `tmp` →
`~/.ssh`) would bind a secret read-write into the sandbox. Every path the
launcher binds or grants therefore passes through here, level by level with
`lstat`, right before the run starts.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class PathRefused(ValueError):
    """A path in a request is unsafe or does not exist; the message says which and why."""


def _plain_absolute(text: str, what: str) -> Path:
    if "\x00" in text:
        raise PathRefused(f"{what} contains a NUL byte; send a plain absolute path")
    if not text.startswith("/"):
        raise PathRefused(f"{what} must be an absolute path, got {text!r}")
    if os.path.normpath(text) != text or text.startswith("//"):
        raise PathRefused(
            f"{what} must be in normal form (no '..', '.', '//' or trailing '/'), got {text!r}"
        )
    return Path(text)


def is_inside(path: Path, root: Path) -> bool:
    """True when `path` is `root` or lies below it (textually; both absolute and normal)."""
    return path == root or root in path.parents


def _check_level(level: Path, what: str, want_dir: bool) -> os.stat_result:
    try:
        st = os.lstat(level)
    except FileNotFoundError as exc:
        raise PathRefused(f"{what}: {level} does not exist; create it before the run") from exc
    except OSError as exc:
        raise PathRefused(f"{what}: cannot inspect {level}: {exc.strerror}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise PathRefused(f"{what}: {level} is a symbolic link; links are never followed")
    if want_dir and not stat.S_ISDIR(st.st_mode):
        raise PathRefused(f"{what}: {level} is not a directory")
    return st


def dir_below(root: Path, text: str, what: str) -> Path:
    """`text` as a real directory inside `root`, every level below `root` checked.

    `root` itself must already be resolved (the launcher resolves the crew
    home once at start).
    """
    path = _plain_absolute(text, what)
    if not is_inside(path, root):
        raise PathRefused(f"{what} must lie inside the crew home {root}, got {text!r}")
    level = root
    for part in path.relative_to(root).parts:
        level = level / part
        _check_level(level, what, want_dir=True)
    return path


def resolved_dir(text: str, what: str) -> Path:
    """`text` as an existing directory whose every level is real (no symlink anywhere)."""
    path = _plain_absolute(text, what)
    level = Path("/")
    for part in path.parts[1:]:
        level = level / part
        _check_level(level, what, want_dir=True)
    return path
