"""Safe file operations for directories an agent can write (computer.md §4).

An agent can write its own directories from inside the sandbox, so it can
plant symlinks, FIFOs or other surprises there. Every path is therefore walked
from a trusted root one level at a time with `openat` + `O_NOFOLLOW`: each
level must be a real directory. Files are written as a temp file and renamed
into place (0600), read only when they are regular files (a FIFO is opened
with `O_NONBLOCK` and never read), and trees are removed through directory
file descriptors. Nothing else in the Computer opens agent paths directly.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePath

log = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(Exception):
    """A path under an agent-writable directory is not what it must be.

    Raised for a symlink, a non-directory where a directory is needed, a path
    outside the trusted root, or an I/O error while walking. The message says
    which path and what to do next; it names the path relative to the root.
    """


def _parts(root: Path, path: PurePath | str) -> tuple[str, ...]:
    """The components of `path` below `root` (an absolute path must lie under root)."""
    p = PurePath(path)
    if p.is_absolute():
        try:
            p = p.relative_to(root)
        except ValueError:
            raise UnsafePath(f"{p} is outside {root}; refusing to touch it.") from None
    parts = tuple(x for x in p.parts if x not in ("", "."))
    if any(x == ".." for x in parts):
        raise UnsafePath(f"{p} contains '..'; refusing to touch it.")
    return parts


def _describe(parts: tuple[str, ...]) -> str:
    return "/".join(parts) or "."


def _open_root(root: Path, create: bool) -> int:
    if create:
        os.makedirs(root, mode=0o700, exist_ok=True)
    try:
        # The root is trusted (the crew home the user chose), so it may itself
        # be reached through a symlink; only levels below it are checked.
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UnsafePath(
            f"cannot open {root}: {exc.strerror}. Check that it is a directory."
        ) from exc


def inherit_owner(dir_fd: int, fd: int) -> None:
    """As root: what the Computer creates belongs to whoever owns the directory it is in.

    A root launcher hands an agent's directories to the engine user
    (`sandbox_launcher/ownership.py`); a token or an AGENTS.md rewritten later
    (a warm server keeps running) must stay readable to it. Elsewhere (the
    crew home's own levels) the owner is root and nothing changes.
    """
    if os.geteuid() != 0:
        return
    st, mine = os.fstat(dir_fd), os.fstat(fd)
    if (st.st_uid, st.st_gid) != (mine.st_uid, mine.st_gid):
        os.fchown(fd, st.st_uid, st.st_gid)


def _open_child_dir(fd: int, name: str, where: str, create: bool, mode: int) -> int:
    made = False
    if create:
        try:
            os.mkdir(name, mode, dir_fd=fd)
            made = True
        except FileExistsError:
            pass
        except OSError as exc:
            raise UnsafePath(f"cannot create {where}: {exc.strerror}.") from exc
    try:
        child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        if made:
            inherit_owner(fd, child)
        return child
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            kind = _kind_of(fd, name)
            raise UnsafePath(
                f"{where} is a {kind}, not a directory; refusing to follow it. "
                "Remove it and the Computer recreates the directory."
            ) from exc
        raise UnsafePath(f"cannot open {where}: {exc.strerror}.") from exc


def _kind_of(fd: int, name: str) -> str:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return "missing entry"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISFIFO(st.st_mode):
        return "FIFO"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISSOCK(st.st_mode):
        return "socket"
    return "special file"


@contextlib.contextmanager
def open_dir(root: Path, path: PurePath | str, *, create: bool = False) -> Iterator[int]:
    """Yield a file descriptor of the directory `path` under `root`, walked safely.

    With `create`, missing levels are made (0700). Raises `UnsafePath` when a
    level is a symlink or not a directory, `FileNotFoundError` when a level is
    missing and `create` is false.
    """
    parts = _parts(root, path)
    fd = _open_root(root, create)
    try:
        for i, name in enumerate(parts):
            nxt = _open_child_dir(fd, name, _describe(parts[: i + 1]), create, 0o700)
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def ensure_dir(root: Path, path: PurePath | str, mode: int = 0o700) -> None:
    """Create `path` and its missing parents under `root` as real directories (0700).

    An existing level that is a symlink or another file type raises `UnsafePath`.
    The final directory's mode is set to `mode` even when it already existed.
    """
    with open_dir(root, path, create=True) as fd:
        os.fchmod(fd, mode)


def restore_dirs(
    root: Path, base: PurePath | str, paths: Iterable[PurePath | str], mode: int = 0o700
) -> list[str]:
    """Make each of `paths` (relative to `base` under `root`) a real directory again.

    Returns what was repaired, one line each (empty when all was well: then it
    cost an `lstat` and an `openat` per level). `base` and the levels above it
    are walked as `open_dir(create=True)` does. The levels below `base` are the
    Computer's own, in a directory the agent can write:
    - a missing level is created;
    - a symlink, FIFO or socket in a level's place is removed (never followed;
      it holds no data) and replaced by a directory;
    - a regular file or a device there raises `UnsafePath`: it may hold the
      agent's work, so only a person may remove it.
    Every level below `base` (and `base`) gets `mode`: a `chmod 000` breaks
    the engine as surely as an `rm -rf`.
    """
    repaired: list[str] = []
    base_parts = _parts(root, base)
    with open_dir(root, base, create=True) as base_fd:
        _set_mode(base_fd, mode)
        for path in paths:
            parts = _parts(root, PurePath(path))
            fd = os.dup(base_fd)
            try:
                for i, name in enumerate(parts):
                    where = _describe((*base_parts, *parts[: i + 1]))
                    if (fixed := _restore_level(fd, name, where, mode)) is not None:
                        repaired.append(fixed)
                    nxt = _open_child_dir(fd, name, where, False, mode)
                    if fixed is not None:
                        inherit_owner(fd, nxt)  # recreated: as the directory it is in
                    os.close(fd)
                    fd = nxt
                    _set_mode(fd, mode)
            finally:
                os.close(fd)
    return repaired


def _restore_level(fd: int, name: str, where: str, mode: int) -> str | None:
    """Make `name` in `fd` a directory when it is missing or a data-less entry; what was done."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    done = f"{where} was missing"
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            return None
        kind = _kind_of(fd, name)
        if not (stat.S_ISLNK(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
            raise UnsafePath(
                f"{where} is a {kind}, not a directory. It may hold the agent's work, so the "
                "Computer leaves it alone: move it away, then wake the agent (a new message, or "
                "POST /agents/<id>/wake on the Computer's socket) and the Computer recreates "
                "the directory."
            )
        try:
            os.unlink(name, dir_fd=fd)
        except OSError as exc:
            raise UnsafePath(f"cannot remove the {kind} at {where}: {exc.strerror}.") from exc
        done = f"{where} was a {kind} (removed, not followed)"
    try:
        os.mkdir(name, mode, dir_fd=fd)
    except FileExistsError:
        pass  # created meanwhile: the open that follows checks what it is
    except OSError as exc:
        raise UnsafePath(f"cannot create {where}: {exc.strerror}.") from exc
    return done


def _set_mode(fd: int, mode: int) -> None:
    if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
        os.fchmod(fd, mode)


def _split_file(root: Path, path: PurePath | str) -> tuple[tuple[str, ...], str]:
    parts = _parts(root, path)
    if not parts:
        raise UnsafePath(f"{path} names the root, not a file.")
    return parts[:-1], parts[-1]


def write_file_atomic(root: Path, path: PurePath | str, data: bytes, mode: int = 0o600) -> None:
    """Write `data` to `path` under `root`: temp file in the same directory, then rename.

    Parent directories are created (0700). Whatever sat at `path` before (a
    regular file, a symlink, a FIFO) is replaced by the rename, never followed;
    a directory in its place raises `UnsafePath`.
    """
    parents, name = _split_file(root, path)
    with open_dir(root, PurePath(*parents) if parents else ".", create=True) as dfd:
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, _CREATE_FLAGS, mode, dir_fd=dfd)
        except OSError as exc:
            raise UnsafePath(
                f"cannot write {_describe((*parents, name))}: {exc.strerror}."
            ) from exc
        try:
            try:
                os.fchmod(fd, mode)
                inherit_owner(dfd, fd)
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            what = _describe((*parents, name))
            if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise UnsafePath(
                    f"{what} is a directory; cannot write a file there. Remove it."
                ) from exc
            raise UnsafePath(f"cannot write {what}: {exc.strerror}.") from exc


def lstat_entry(root: Path, path: PurePath | str) -> os.stat_result | None:
    """`lstat` of `path` under `root` through safe directory fds; None when missing."""
    parents, name = _split_file(root, path)
    try:
        with open_dir(root, PurePath(*parents) if parents else ".") as dfd:
            return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def read_regular_file(root: Path, path: PurePath | str, max_bytes: int) -> bytes | None:
    """Read a regular file under `root`; None when it is missing or not a regular file.

    A symlink, FIFO, socket or device at `path` counts as absent: it is never
    followed and never blocks (opened `O_NOFOLLOW | O_NONBLOCK`, checked with
    `fstat` before reading). A file over `max_bytes` raises `UnsafePath`. A
    symlinked or non-directory parent raises `UnsafePath`.
    """
    parents, name = _split_file(root, path)
    try:
        with open_dir(root, PurePath(*parents) if parents else ".") as dfd:
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.EISDIR):
                    return None
                raise UnsafePath(
                    f"cannot read {_describe((*parents, name))}: {exc.strerror}."
                ) from exc
            try:
                return _read_regular_fd(fd, max_bytes, _describe((*parents, name)))
            finally:
                os.close(fd)
    except FileNotFoundError:
        return None


def _read_regular_fd(fd: int, max_bytes: int, what: str) -> bytes | None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return None
    if st.st_size > max_bytes:
        raise UnsafePath(f"{what} is {st.st_size} bytes, over the {max_bytes}-byte limit.")
    # The file is regular, so O_NONBLOCK has no effect on reads.
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise UnsafePath(f"{what} grew over the {max_bytes}-byte limit while being read.")
    return b"".join(chunks)


def read_trusted_file(path: Path, max_bytes: int) -> bytes | None:
    """Read a regular file outside agent reach (the user's own config); None when missing.

    Symlinks are followed (the user may link their dotfiles), but a FIFO or
    device never blocks and counts as absent; over `max_bytes` raises `UnsafePath`.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.EISDIR, errno.ELOOP):
            return None
        raise UnsafePath(f"cannot read {path}: {exc.strerror}.") from exc
    try:
        return _read_regular_fd(fd, max_bytes, str(path))
    finally:
        os.close(fd)


def copy_if_newer(source: Path, root: Path, path: PurePath | str, max_bytes: int) -> bool:
    """Copy the trusted `source` to `path` under `root` unless the copy is not older.

    Returns True when a copy was written, False when skipped (source missing,
    or the destination is a regular file with mtime ≥ the source's). The copy
    keeps the source's mtime so the next comparison is exact. Every level of
    the destination must be a real directory; the write is temp file + rename.
    """
    try:
        src_st = os.stat(source)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(src_st.st_mode):
        return False
    dst_st = lstat_entry(root, path)
    if (
        dst_st is not None
        and stat.S_ISREG(dst_st.st_mode)
        and dst_st.st_mtime_ns >= src_st.st_mtime_ns
    ):
        return False
    data = read_trusted_file(source, max_bytes)
    if data is None:
        return False
    write_file_atomic(root, path, data)
    parents, name = _split_file(root, path)
    with open_dir(root, PurePath(*parents) if parents else ".") as dfd:
        os.utime(
            name,
            ns=(src_st.st_atime_ns, src_st.st_mtime_ns),
            dir_fd=dfd,
            follow_symlinks=False,
        )
    return True


def remove_tree(root: Path, path: PurePath | str) -> None:
    """Remove `path` under `root` (a directory tree or a single entry), never following links.

    Missing is fine. The walk uses directory fds, without recursion and with
    a fixed number of them open (`_remove_dir_tree`), so a symlink planted
    inside is removed, not followed, and no depth makes it fail.
    """
    parents, name = _split_file(root, path)
    try:
        with open_dir(root, PurePath(*parents) if parents else ".") as dfd:
            _remove_entry(dfd, name)
    except FileNotFoundError:
        return


def clear_dir(root: Path, path: PurePath | str) -> None:
    """Remove every entry inside the directory `path` under `root` (kept, emptied)."""
    try:
        with open_dir(root, path) as dfd:
            for name in os.listdir(dfd):
                _remove_entry(dfd, name)
    except FileNotFoundError:
        return


def _remove_entry(dfd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        _remove_dir_tree(dfd, name)
    else:
        os.unlink(name, dir_fd=dfd)


def _unlink_all_but_dirs(fd: int) -> list[str]:
    """Unlink every non-directory in `fd`; the names of its subdirectories."""
    subdirs = []
    with os.scandir(fd) as entries:  # scandir works on its own duplicate of fd
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(entry.name)
            else:
                os.unlink(entry.name, dir_fd=fd)
    return subdirs


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _remove_dir_tree(parent: int, name: str) -> None:
    """Remove the directory `name` in `parent` and everything below it, never following links.

    Iterative, not recursive: an agent can nest directories thousands of
    levels deep, and `shutil.rmtree` raised `RecursionError` on 1,500 of them
    (issue 12). At most three descriptors are open at once, whatever the
    depth: going down opens the child and closes the level above; going back
    up opens `..` and checks it is the directory we came from (same device
    and inode), so a tree moved meanwhile is refused, not followed.
    """
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    here = _identity(fd)
    # One row per level above the current one: (its identity, its subdirectories
    # still to remove, the name of the one we went down into).
    above: list[tuple[tuple[int, int], list[str], str]] = []
    try:
        pending = _unlink_all_but_dirs(fd)
        while True:
            if pending:
                child = pending.pop()
                below = os.open(child, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = below
                above.append((here, pending, child))
                here = _identity(fd)
                pending = _unlink_all_but_dirs(fd)
                continue
            if not above:
                break
            expected, pending, child = above.pop()
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = up
            here = _identity(fd)
            if here != expected:
                raise UnsafePath(
                    f"{name}: a directory moved while it was being removed; "
                    "stop whatever writes there and try again."
                )
            os.rmdir(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def move_aside(root: Path, path: PurePath | str, new_name: str) -> None:
    """Rename the entry `path` under `root` to `new_name` in the same directory (no link followed)."""
    parents, name = _split_file(root, path)
    with open_dir(root, PurePath(*parents) if parents else ".") as dfd:
        os.rename(name, new_name, src_dir_fd=dfd, dst_dir_fd=dfd)
