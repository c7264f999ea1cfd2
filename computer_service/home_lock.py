"""`CrewHomeLock`: one running Computer per crew home.

Two Computers on one crew home would share sockets, run directories and agent
homes, and (with one token) replace each other's connection upstream. The
second one refuses before it connects: an exclusive `flock` on
`<crew home>/computer.lock`, held for the life of the process. The kernel
drops it when the process dies, even by SIGKILL, so a crash never leaves a
stale lock behind; the pid in the file only makes the refusal readable.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "computer.lock"


class CrewHomeBusy(Exception):
    """Another Computer holds the crew home."""


class CrewHomeLock:
    """The exclusive lock of a crew home (see the module doc)."""

    def __init__(self, crew_home: Path) -> None:
        self.path = crew_home / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise `CrewHomeBusy` saying who holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise CrewHomeBusy(
                f"another crew-computer (pid {holder}) is running with the crew home "
                f"{self.path.parent}; stop it first, or give this one its own CREW_HOME"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Let the next Computer have the crew home."""
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None
