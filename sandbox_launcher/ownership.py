"""Hand an agent's directories to the engine user before its run (a root launcher only).

The Computer (root) writes the agent's files 0600 and its directories 0700;
an engine running as the engine user (`crew_common.engine_user`) must read
and write them. Before every run and warm-server start the launcher gives
that user what the Computer made: the agent's directory and its runtime
directory, every entry of the Computer's own directories (a short fixed
list: its files are rewritten there), and any directory not yet the engine
user's with everything below it (once: a crew home an earlier root run left).
What the engine made is its already, so the agent's `work/` tree is not walked.

Every level is opened with `O_NOFOLLOW` below a directory fd and changed with
`fchown`/`fchownat(AT_SYMLINK_NOFOLLOW)`: the agent can write these directories
and may have put a symlink anywhere; a symlink is changed itself, never followed.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path, PurePath

from sandbox_launcher.policy import SandboxPolicy

log = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# The Computer's directories (computer.md §4): it writes files into these, so
# their entries are looked at on every run even when the directory is the engine's.
AGENT_PLACES = (".", "engines", "engines/opencode", "work")
RUNTIME_PLACES = (".", "config", "config/opencode", "config/opencode/node_modules", "cache",
                  "cache/opencode", "state", "tmp")  # fmt: skip


class HandOverFailed(Exception):
    """An agent directory could not be given to the engine user; the message says which."""


def hand_over(policy: SandboxPolicy, ids: tuple[int, int]) -> int:
    """Give the agent's directories to the engine user `ids` (uid, gid); returns entries changed."""
    changed = 0
    for base, places in ((policy.agent_dir, AGENT_PLACES), (policy.runtime_dir, RUNTIME_PLACES)):
        try:
            fd = os.open(base, _DIR_FLAGS)
        except OSError as exc:
            raise HandOverFailed(f"cannot open {base}: {exc.strerror}") from exc
        try:
            changed += _own_dir(fd, ids, str(base))
            for place in places[1:]:
                changed += _place(fd, PurePath(place), ids, str(base / place))
        finally:
            os.close(fd)
    return changed


def _place(base_fd: int, place: PurePath, ids: tuple[int, int], where: str) -> int:
    """One of the Computer's directories below `base_fd` (missing or not a directory: skipped)."""
    fd = os.dup(base_fd)
    try:
        for name in place.parts:
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    return 0  # the Computer's repair recreates it before the next run
                raise HandOverFailed(f"cannot open {where}: {exc.strerror}") from exc
            os.close(fd)
            fd = nxt
        return _own_dir(fd, ids, where)
    finally:
        os.close(fd)


def _own_dir(fd: int, ids: tuple[int, int], where: str) -> int:
    """The directory `fd` and its entries the engine user's; into foreign subdirectories, deeper."""
    changed = _chown_fd(fd, ids, where)
    for name in os.listdir(fd):
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed meanwhile
        if (st.st_uid, st.st_gid) == ids:
            continue
        if stat.S_ISDIR(st.st_mode):
            changed += _foreign_tree(fd, name, ids, f"{where}/{name}")
            continue
        try:
            os.chown(name, *ids, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise HandOverFailed(f"cannot hand {where}/{name} over: {exc.strerror}") from exc
        changed += 1
    return changed


def _foreign_tree(parent: int, name: str, ids: tuple[int, int], where: str) -> int:
    """A directory that is not the engine user's yet, with everything below it."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            return 0  # replaced meanwhile (by the agent): what it put there is its own
        raise HandOverFailed(f"cannot open {where}: {exc.strerror}") from exc
    try:
        return _own_dir(fd, ids, where)
    finally:
        os.close(fd)


def _chown_fd(fd: int, ids: tuple[int, int], where: str) -> int:
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid) == ids:
        return 0
    try:
        os.fchown(fd, *ids)
    except OSError as exc:
        raise HandOverFailed(f"cannot hand {where} over: {exc.strerror}") from exc
    return 1


def shared_dir_readable(path: Path) -> None:
    """The run's `bin/` (the `crew` wrapper): the Computer's, readable and runnable by others.

    Its parents stay 0700: on the host only root gets there; in the sandbox the
    engine user reaches it through the tmpfs its hidden parents become.
    """
    fd = os.open(path, _DIR_FLAGS)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o005 != 0o005:
            os.fchmod(fd, 0o755)
        for name in os.listdir(fd):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o005 != 0o005:
                file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                try:
                    os.fchmod(file_fd, stat.S_IMODE(st.st_mode) | 0o055)
                finally:
                    os.close(file_fd)
    finally:
        os.close(fd)
