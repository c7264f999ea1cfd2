"""Git repositories in an agent's work directory: hooks and config stay read-only (issue 12).

A `.git/hooks/pre-commit` or a `core.fsmonitor` command planted by an agent
would run unsandboxed, as the user, the next time the user runs git in that
repository. Like sandbox-runtime (mandatory deny of `.git/hooks` and
`.git/config`, found by a bounded search below the working directory) and
Codex (the `.git` of a writable root kept read-only), each run looks for the
repositories already in `work/` (at most `MAX_DEPTH` levels down, never
following a symlink, never into `node_modules`) and the backends then:

- bind each `.git` onto itself, so the directory cannot be renamed or replaced
  (a mount point cannot be moved), and bind its `hooks/` and `config` read-only
  on top; everything else in `.git` stays writable, so `git add` and
  `git commit` work (Linux);
- deny writes to `hooks/`, `config` and `commondir` and to the `.git`
  directory entry itself (Seatbelt, where a path that does not exist yet can be
  denied too).

A missing `hooks/` or `config` is created empty first, so there is something
to bind. On Linux a `commondir` file (it moves where git reads config and hooks
from) cannot be denied before it exists: `remove_new_commondirs` deletes one a
run created, after the run. What stays open is documented in the README next
to the work directory: a repository created during a turn is guarded from the
next turn on, and a repository whose `hooks` or `config` is a symbolic link is
not guarded (logged).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

MAX_DEPTH = 3  # work/.git, work/a/.git, work/a/b/.git (sandbox-runtime searches 3 deep)
MAX_DIRECTORIES = 2000  # directories listed per run, at most: a huge tree is cut short
SKIPPED = frozenset({"node_modules", ".venv", "__pycache__"})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def find_git_dirs(work_dir: Path) -> list[Path]:
    """The real `.git` directories in `work_dir` and below (breadth first, bounded)."""
    found: list[Path] = []
    level = [work_dir]
    listed = 0
    for _depth in range(MAX_DEPTH):
        below: list[Path] = []
        for directory in level:
            if listed >= MAX_DIRECTORIES:
                log.warning("stopped looking for repositories after %d directories", listed)
                return found
            listed += 1
            try:
                with os.scandir(directory) as entries:
                    for entry in entries:
                        if not entry.is_dir(follow_symlinks=False):
                            continue
                        if entry.name == ".git":
                            found.append(Path(entry.path))
                        elif entry.name not in SKIPPED:
                            below.append(Path(entry.path))
            except OSError as exc:
                log.warning("cannot look for repositories in %s: %s", directory, exc)
        level = below
    return found


def _entry_mode(dir_fd: int, name: str) -> int | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


def prepare_guard(git_dir: Path) -> bool:
    """Make sure `hooks/` and `config` exist as a real directory and file; True when guardable.

    Works through a descriptor of `git_dir` opened without following links, so
    nothing outside the repository is ever created.
    """
    try:
        fd = os.open(git_dir, _DIR_FLAGS)
    except OSError as exc:
        log.warning("not guarding %s: %s", git_dir, exc)
        return False
    try:
        hooks, config = _entry_mode(fd, "hooks"), _entry_mode(fd, "config")
        if hooks is None:
            os.mkdir("hooks", 0o755, dir_fd=fd)
        elif not stat.S_ISDIR(hooks):
            log.warning("not guarding %s: its hooks is not a directory (a link?)", git_dir)
            return False
        if config is None:
            os.close(os.open("config", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd))
        elif not stat.S_ISREG(config):
            log.warning("not guarding %s: its config is not a regular file (a link?)", git_dir)
            return False
        return True
    except OSError as exc:
        log.warning("not guarding %s: %s", git_dir, exc)
        return False
    finally:
        os.close(fd)


def guarded_git_dirs(work_dir: Path) -> tuple[Path, ...]:
    """The repositories of `work_dir` whose hooks and config a run may not change."""
    return tuple(g for g in find_git_dirs(work_dir) if prepare_guard(g))


def commondir_absent(git_dirs: Iterable[Path]) -> tuple[Path, ...]:
    """The `.git` directories without a `commondir` file now (checked again after the run)."""
    return tuple(g for g in git_dirs if not os.path.lexists(g / "commondir"))


def remove_new_commondirs(git_dirs: Iterable[Path]) -> None:
    """Delete a `commondir` a run planted in a guarded repository (it would move config and
    hooks elsewhere). Never raises."""
    for git_dir in git_dirs:
        try:
            fd = os.open(git_dir, _DIR_FLAGS)
        except OSError:
            continue  # the repository is gone: nothing to read config from
        try:
            os.unlink("commondir", dir_fd=fd)
            log.warning("removed a commondir the agent planted in %s", git_dir)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove the commondir planted in %s: %s", git_dir, exc)
        finally:
            os.close(fd)
