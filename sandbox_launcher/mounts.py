"""Aliases of the deny roots: other mounts through which their contents show (issue 12, escape 3).

A bind mount of a denied directory elsewhere (`mount --bind ~/.kube
/srv/alias`, WSL's `/mnt/c/Users`, a bind-mounted copy of `/home`) shows the
same files under another path. bwrap's tmpfs over `$HOME` does not cover
that path, and Landlock grants follow inodes: granting the alias's mount
point would make the real path readable as well. So every mount whose
source lies under a deny root, or contains one, is found in
`/proc/self/mountinfo` and masked in both modes (never granted).

Another device shows them too (issue 20): an overlay mount whose lower or
upper directory lies under a deny root, or contains one, shows its files
through the overlay's own device; so does a FUSE mount whose source is such
a path (bindfs). Their layers come from mountinfo (the overlay's super
options, the FUSE source) and are judged like a bind's root, also when a
layer is itself an alias. A mount whose origin cannot be judged (a FUSE file
system with no source path: sshfs, gvfs, rclone; an overlay layer given as a
relative path) is masked as well, and named in the launcher's health.

`judge` and `aliases` are pure (mountinfo text in, paths out) and
table-tested; `read_mountinfo` is the only I/O.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

log = logging.getLogger(__name__)

MOUNTINFO = "/proc/self/mountinfo"
_OVERLAY_LAYER_KEYS = ("lowerdir", "upperdir", "lowerdir+", "datadir+")
_ROOT = PurePosixPath("/")


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo: which file system, which of its directories, mounted where."""

    device: str  # major:minor
    root: PurePosixPath  # the directory of that file system this mount shows
    mount_point: PurePosixPath
    fs_type: str = ""
    source: str = ""  # unescaped
    options: str = ""  # the super options, still escaped (a comma in a value is \054)


@dataclass(frozen=True)
class Unjudged:
    """A mount masked because what it shows cannot be known."""

    mount_point: str
    fs_type: str
    source: str

    def __str__(self) -> str:
        return (
            f"{self.mount_point}: a {self.fs_type or 'unknown'} mount of {self.source or '?'} "
            "whose origin cannot be judged (it could show $HOME or the crew home): "
            "hidden in every sandbox"
        )


@dataclass(frozen=True)
class Judgement:
    """What shows a deny root's contents elsewhere, and what could not be judged."""

    aliases: list[str]  # mount points (or paths below them) to mask
    unjudged: list[Unjudged]  # masked too


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
        # After the optional fields: "-", the file system type, the source, the options.
        tail = fields[fields.index("-", 6) + 1 :] if "-" in fields[6:] else []
        fs_type, source, options = [*tail, "", "", ""][:3]
        mounts.append(
            Mount(
                fields[2],
                PurePosixPath(root),
                PurePosixPath(point),
                fs_type,
                _unescape(source),
                options,
            )
        )
    return mounts


def _split_layers(value: str) -> list[str]:
    """An overlay `lowerdir` value: layers split at ":" ("::" before data-only layers),
    with the backslash escapes (of ":", ",", a backslash) undone."""
    layers: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(value):
        char = value[i]
        if char == "\\" and i + 1 < len(value):
            current.append(value[i + 1])
            i += 2
            continue
        if char == ":":
            layers.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    layers.append("".join(current))
    return [layer for layer in layers if layer]


def _is_fuse(mount: Mount) -> bool:
    # fuseblk is a disk's own file system (ntfs-3g, exfat): judged by its device.
    return mount.fs_type == "fuse" or mount.fs_type.startswith("fuse.")


def origins(mount: Mount) -> list[PurePosixPath] | None:
    """The directories a mount of another file system shows (overlay layers, a FUSE
    source); [] for a file system of its own, None when they cannot be known."""
    if mount.fs_type == "overlay":
        layers: list[str] = []
        for option in mount.options.split(","):
            key, _, value = option.partition("=")
            if key in _OVERLAY_LAYER_KEYS:
                layers += _split_layers(_unescape(value))
        if not layers or not all(layer.startswith("/") for layer in layers):
            return None
        return [PurePosixPath(layer) for layer in layers]
    if _is_fuse(mount):
        return [PurePosixPath(mount.source)] if mount.source.startswith("/") else None
    return []


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


def _alias_of(mount: Mount, inner: PurePosixPath) -> PurePosixPath | None:
    """Where `inner` (a path of `mount`'s file system) shows through `mount`, if it does."""
    if _inside(mount.root, inner):
        return mount.mount_point
    if _inside(inner, mount.root):
        return mount.mount_point / inner.relative_to(mount.root)
    return None


def _layer_alias(mount: Mount, layer: PurePosixPath, source: PurePosixPath) -> PurePosixPath | None:
    """Where `source` shows through `mount`, one of whose layers is `layer`."""
    if _inside(layer, source):
        return _alias_of(mount, _ROOT)
    if _inside(source, layer):
        return _alias_of(mount, _ROOT / source.relative_to(layer))
    return None


def judge(text: str, deny_roots: tuple[str, ...]) -> Judgement:
    """Paths outside the deny roots that show contents of one (to be masked), and the
    mounts masked because their origin cannot be judged.

    For each deny root, its file system (device) and its path inside that
    file system come from the mount it is on. Another mount of the same
    device whose root lies inside that path is an alias (its mount point is
    masked); one whose root contains that path shows the deny root below its
    mount point (that path is masked). An overlay or FUSE mount is judged by
    its layers instead (`origins`): a layer inside a deny root or an alias
    makes the mount an alias, a layer containing one shows it below the mount
    point. Mount points inside a deny root are left alone: they are hidden
    with it.
    """
    mounts = parse_mountinfo(text)
    denied = [PurePosixPath(r) for r in deny_roots]
    found: list[str] = []
    unjudged: list[Unjudged] = []

    def add(alias: PurePosixPath | None, mount: Mount) -> bool:
        if alias is None or any(_inside(alias, d) for d in denied) or str(alias) in found:
            return False
        if _holder(mounts, alias) is not mount:
            return False  # covered by a later mount: not reachable through this one
        found.append(str(alias))
        return True

    outside = [m for m in mounts if not any(_inside(m.mount_point, d) for d in denied)]
    for deny in denied:
        holder = _holder(mounts, deny)
        if holder is None:
            continue
        inner = holder.root / deny.relative_to(holder.mount_point)
        for mount in outside:
            if mount.device == holder.device:
                add(_alias_of(mount, inner), mount)
    # The mounts the deny roots lie on, and those above them, are judged by device
    # alone: they are where $HOME lives (a container's overlay root, a home on sshfs),
    # and masking them would hide the deny roots' own way down.
    layered = [m for m in outside if not any(_inside(d, m.mount_point) for d in denied)]
    for mount in layered:
        if origins(mount) is None and add(mount.mount_point, mount):
            unjudged.append(Unjudged(str(mount.mount_point), mount.fs_type, mount.source))
    # Layers judged against the deny roots and every alias found so far (an overlay of
    # a bind of ~/.ssh), until nothing new turns up.
    grew = True
    while grew:
        sources = [*denied, *(PurePosixPath(a) for a in found)]
        grew = False
        for mount in layered:
            for layer in origins(mount) or []:
                for source in sources:
                    grew = add(_layer_alias(mount, layer, source), mount) or grew
    return Judgement(found, unjudged)


def aliases(text: str, deny_roots: tuple[str, ...]) -> list[str]:
    """Paths outside the deny roots that show contents of one: to be masked (`judge`)."""
    return judge(text, deny_roots).aliases


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


def unjudged_mounts(deny_roots: tuple[Path, ...], hidden: tuple[Path, ...] = ()) -> list[str]:
    """Why each mount masked for want of a judgement is (for the health), less those below
    `hidden` (places every sandbox hides anyway: the gvfs of `/run/user/<uid>`)."""
    found = judge(read_mountinfo(), tuple(str(r) for r in deny_roots)).unjudged
    places = [PurePosixPath(h) for h in hidden]
    return [
        str(u) for u in found if not any(_inside(PurePosixPath(u.mount_point), h) for h in places)
    ]
