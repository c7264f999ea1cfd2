"""The private Unix socket both services listen on: 0600 in a 0700 directory, peers checked.

The file modes keep other users out on a normal system; the peer check is the
second lock: uvicorn's HTTP protocol, but a connection from any uid other than
ours is closed before a byte of HTTP is read or written.

Depends on uvicorn's `H11Protocol` (not public API): the uvicorn range it was
checked against is pinned in pyproject.toml, and tests/common/test_uvicorn_pin.py
fails loudly on another version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import struct
import sys
from pathlib import Path

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

BACKLOG = 128
# macOS: getsockopt(SOL_LOCAL, LOCAL_PEERCRED) gives a struct xucred
# { u_int cr_version; uid_t cr_uid; short cr_ngroups; gid_t cr_groups[16]; }.
_SOL_LOCAL = 0
_LOCAL_PEERCRED = 0x001
_XUCRED = "IIh16I"
_XUCRED_VERSION = 0


class UnsafeSocketPath(OSError):
    """The socket or its directory cannot be used safely; the message says why and what to do."""


class SocketInUse(OSError):
    """Another process already answers on this socket."""


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket; None if unknown (logged)."""
    try:
        if sys.platform.startswith("linux"):
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            return int(uid)
        if sys.platform == "darwin":
            creds = sock.getsockopt(_SOL_LOCAL, _LOCAL_PEERCRED, struct.calcsize(_XUCRED))
            version, uid = struct.unpack_from("II", creds)
            return int(uid) if version == _XUCRED_VERSION else None
    except OSError as exc:
        log.warning("cannot read the peer credentials of a connection: %s", exc)
    return None


def peer_checked_h11(allowed_uid: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol that closes, unanswered, every connection not from `allowed_uid`."""

    class PeerCheckedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            sock = transport.get_extra_info("socket")
            uid = peer_uid(sock) if sock is not None else None
            if uid != allowed_uid:
                log.warning("refused a connection from uid %s (only uid %s)", uid, allowed_uid)
                # Checked before the HTTP side starts: it never sees this connection.
                # connection_lost still runs and closes `self.transport`.
                self.transport = transport
                transport.close()
                return
            super().connection_made(transport)

    return PeerCheckedH11Protocol


def private_dir(path: Path) -> None:
    """Create `path` 0700, or check an existing one is a real directory of ours and make it 0700."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise UnsafeSocketPath(
            f"{path} is not a directory owned by this user (a symlink, a file or another "
            "user's): remove it and restart"
        )
    os.chmod(path, 0o700)


def bind_private_socket(path: Path, backlog: int = BACKLOG) -> socket.socket:
    """A listening, non-blocking Unix socket at `path`: 0600, in a 0700 directory of ours.

    A leftover socket nobody answers on is replaced; one that answers raises
    `SocketInUse`; anything else at `path` raises `UnsafeSocketPath`.
    """
    private_dir(path.parent)
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise UnsafeSocketPath(f"{path} exists and is not a socket; refusing to replace it")
        if _answers(path):
            raise SocketInUse(f"another process already answers on {path}: stop it first")
        os.unlink(path)  # left by a process that did not stop cleanly
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # No window in which the socket exists with looser permissions.
        old_umask = os.umask(0o177)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def remove_dead_sockets(directory: Path, pattern: str) -> list[str]:
    """Delete the sockets in `directory` named like `pattern` that nobody listens on; their names.

    Dead means a connection is refused (ECONNREFUSED): the process that bound
    it is gone without removing it. One that answers, is busy, or cannot be
    probed stays, as does anything that is not a socket. Other `OSError`s
    (the directory unreadable) are raised.
    """
    removed = []
    for path in sorted(directory.glob(pattern)):
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode) or not _refused(path):
                continue
            os.unlink(path)
        except FileNotFoundError:
            continue  # gone meanwhile
        removed.append(path.name)
    return removed


def _refused(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Non-blocking: a live listener with a full backlog answers EAGAIN instead of blocking.
    probe.setblocking(False)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        return True
    except OSError:  # busy, or not ours to probe: leave it
        return False
    finally:
        probe.close()
    return False


def _answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True
