"""Aliases of the deny roots: other mounts through which their contents show (issue 12, escape 3).

A bind mount of a denied directory elsewhere (`mount --bind ~/.kube
/srv/alias`, WSL's `/mnt/c/Users`, a bind-mounted copy of `/home`) shows the
same files under another path. bwrap's tmpfs over `$HOME` does not cover
that path, and Landlock grants follow inodes: granting the alias's mount
point would make the real path readable as well. So every mount whose
source lies under a deny root, or contains one, is found in
`/proc/self/mountinfo` and masked in both modes (never granted).

`aliases` is pure (mountinfo text in, paths out) and table-tested;
`read_mountinfo` is the only I/O.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

log = logging.getLogger(__name__)

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo: which file system, which of its directories, mounted where."""

    device: str  # major:minor
    root: PurePosixPath  # the directory of that file system this mount shows
    mount_point: PurePosixPath


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \040 \011 \012 \134.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a mountinfo text, in order (later mounts cover earlier ones)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if not root.startswith("/") or not point.startswith("/"):
            continue  # e.g. the root of an nsfs mount: not a directory tree
        mounts.append(Mount(fields[2], PurePosixPath(root), PurePosixPath(point)))
    return mounts


def _inside(path: PurePosixPath, root: PurePosixPath) -> bool:
    return path == root or root in path.parents


def _holder(mounts: list[Mount], path: PurePosixPath) -> Mount | None:
    """The mount `path` is on: the last one whose mount point contains it."""
    found = None
    for mount in mounts:
        deeper = found is None or len(mount.mount_point.parts) >= len(found.mount_point.parts)
        if deeper and _inside(path, mount.mount_point):
            found = mount
    return found


def aliases(text: str, deny_roots: tuple[str, ...]) -> list[str]:
    """Paths outside the deny roots that show contents of one: to be masked.

    For each deny root, its file system (device) and its path inside that
    file system come from the mount it is on. Another mount of the same
    device whose root lies inside that path is an alias (its mount point is
    masked); one whose root contains that path shows the deny root below its
    mount point (that path is masked). Mount points inside a deny root are
    left alone: they are hidden with it.
    """
    mounts = parse_mountinfo(text)
    found: list[str] = []
    denied = [PurePosixPath(r) for r in deny_roots]
    for deny in denied:
        holder = _holder(mounts, deny)
        if holder is None:
            continue
        inner = holder.root / deny.relative_to(holder.mount_point)
        for mount in mounts:
            if mount.device != holder.device or any(_inside(mount.mount_point, d) for d in denied):
                continue
            if _inside(mount.root, inner):
                alias = mount.mount_point
            elif _inside(inner, mount.root):
                alias = mount.mount_point / inner.relative_to(mount.root)
            else:
                continue
            if _inside(alias, deny) or any(_inside(alias, d) for d in denied):
                continue
            if _holder(mounts, alias) is not mount:
                continue  # covered by a later mount: not reachable through this one
            if str(alias) not in found:
                found.append(str(alias))
    return found


def read_mountinfo() -> str:
    """This process's mountinfo; empty (logged) when it cannot be read."""
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError as exc:
        log.warning("cannot read %s (%s): aliases of denied directories not masked", MOUNTINFO, exc)
        return ""


def alias_masks(deny_roots: tuple[Path, ...]) -> tuple[tuple[Path, bool], ...]:
    """The aliases of `deny_roots` mounted now, each with "is a directory"."""
    found = aliases(read_mountinfo(), tuple(str(r) for r in deny_roots))
    return tuple((Path(a), os.path.isdir(a)) for a in found if os.path.lexists(a))
