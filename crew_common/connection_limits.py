"""Keeping a local HTTP socket answerable: a connection cap, timeouts, and sane accept errors.

A client that opens connections and sends nothing would otherwise hold a file
descriptor each for ever (uvicorn arms its keep-alive timer only after a first
response), until `accept()` fails with EMFILE — and asyncio logs that once a
second for as long as it lasts. Both our servers (the Computer's socket and
crew-server) use what is here:

- `limited_h11` closes a connection that has not sent a whole request head
  within `header_timeout_s` (at its start, and again after each response: the
  idle keep-alive limit; a slowloris sending its head byte by byte too), and
  keeps at most `max_connections` open: a new one beyond the cap closes the
  connection that has waited longest for a request (`close_idlest`), so a
  client with a request to make gets in while idle ones are held; only when
  every open connection is in a request is the newcomer closed;
- `SheddingListener` is the listening socket: when `accept()` runs out of file
  descriptors it first closes the idlest connection (`make_room`: the
  descriptor is free on the next loop turn, when the accept is tried again),
  and when none is idle frees a reserved descriptor, accepts the waiting
  connection and closes it (the client sees a closed connection instead of
  hanging, and the event loop does not spin), logging the first failure and
  then a summary at most once a minute;
- `raise_open_file_limit` raises the soft RLIMIT_NOFILE to the hard one.

Depends on uvicorn's `H11Protocol` internals, as `unix_socket.peer_checked_h11`
does (pinned; tests/common/test_uvicorn_pin.py).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

# Errors that mean "out of descriptors": shed the connection, do not spin.
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)
SUMMARY_EVERY_S = 60.0
# macOS refuses a soft limit above OPEN_MAX even when the hard limit is "unlimited".
_DARWIN_OPEN_MAX = 10240


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections one socket serves at once, and how long one may idle."""

    max_connections: int = 64
    # From connect (or the end of the last response) to a complete request head.
    header_timeout_s: float = 10.0


def limited_h11(base: type[H11Protocol], limits: ConnectionLimits) -> type[H11Protocol]:
    """`base` (an h11 protocol class) with the connection cap and the header/idle timeout."""

    evictions = AcceptErrorLog(
        f"already {limits.max_connections} connections open: closed the one idle the longest"
    )
    refusals = AcceptErrorLog(
        f"refused a connection: already {limits.max_connections} open, each in a request"
    )

    class LimitedH11Protocol(base):  # type: ignore[valid-type,misc]
        # The request this connection waits for: none has started while `cycle` is this one.
        _waiting_after: Any = None
        _waiting_since: float | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            if open_count(self.connections) >= limits.max_connections:
                if close_idlest(self.connections):
                    evictions.failed(None)
                else:
                    refusals.failed(None)
                    # Like the peer check: the HTTP side never sees this connection.
                    self.transport = transport
                    transport.close()
                    return
            super().connection_made(transport)
            if not transport.is_closing():
                self._wait_for_request()

        def on_response_complete(self) -> None:
            # First: a pipelined request that uvicorn starts in there is a new cycle.
            self._wait_for_request()
            super().on_response_complete()

        def waiting_since(self) -> float | None:
            """Since when (loop time) this connection waits for a request head; None if in one."""
            if self.cycle is not self._waiting_after or self.transport.is_closing():
                return None
            return self._waiting_since

        def _wait_for_request(self) -> None:
            waiting_after = self._waiting_after = self.cycle
            self._waiting_since = self.loop.time()
            self.loop.call_later(limits.header_timeout_s, self._header_timeout, waiting_after)

        def _header_timeout(self, waiting_after: Any) -> None:
            if self.cycle is waiting_after and not self.transport.is_closing():
                # abort, not close: a client that reads nothing would keep the descriptor.
                self.transport.abort()

    return LimitedH11Protocol


def open_count(connections: Iterable[Any]) -> int:
    """How many of `connections` are not closing (a closed one leaves the set a loop turn later)."""
    return sum(1 for conn in connections if not conn.transport.is_closing())


def close_idlest(connections: Iterable[Any]) -> bool:
    """Close the connection that has waited longest for a request head; False if none waits.

    `connections` is uvicorn's `server_state.connections`; only protocols of
    `limited_h11` can say they wait. The descriptor is free on the next loop turn.
    """
    idlest: Any = None
    since = float("inf")
    for conn in connections:
        waiting = getattr(conn, "waiting_since", None)
        started = waiting() if waiting is not None else None
        if started is not None and started < since:
            idlest, since = conn, started
    if idlest is None:
        return False
    idlest.transport.abort()
    return True


class AcceptErrorLog:
    """Logs a repeating failure once, then a count at most every `SUMMARY_EVERY_S`."""

    def __init__(self, what: str, clock: Any = time.monotonic) -> None:
        self.what = what
        self.count = 0
        self._unreported = 0
        self._clock = clock
        self._last_line: float | None = None

    def failed(self, exc: OSError | None) -> None:
        """Count one failure; log it if it is the first, or a summary if a minute passed."""
        self.count += 1
        now = self._clock()
        detail = f": {exc}" if exc is not None else ""
        if self._last_line is None:
            log.error(
                "%s%s (logged once; a count follows at most every %.0f s)",
                self.what,
                detail,
                SUMMARY_EVERY_S,
            )
            self._last_line = now
            return
        self._unreported += 1
        if now - self._last_line >= SUMMARY_EVERY_S:
            self.summary()

    def summary(self) -> None:
        """Log how many failures were not logged since the last line (nothing if none)."""
        if self._unreported:
            log.error("%s: %d more times (%d in all)", self.what, self._unreported, self.count)
            self._unreported = 0
            self._last_line = self._clock()


class SheddingListener(socket.socket):
    """A listening socket whose `accept()` sheds a connection when out of file descriptors.

    Made from a bound, listening socket with `SheddingListener.take(sock)`.
    Call `close()` (or `report()`) at the end to log the final count.
    """

    errors: AcceptErrorLog
    _spare: int | None
    _make_room: Callable[[], bool] | None

    @classmethod
    def take(
        cls, sock: socket.socket, make_room: Callable[[], bool] | None = None
    ) -> SheddingListener:
        """Wrap `sock` (which is detached: use the result instead).

        `make_room()` closes an idle connection, if there is one (True); it is
        tried before a waiting connection is shed.
        """
        listener = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        listener.setblocking(False)
        listener.errors = AcceptErrorLog(
            "cannot accept a connection (out of file descriptors); closing idle or "
            "waiting connections"
        )
        listener._spare = _reserve_fd()
        listener._make_room = make_room
        return listener

    def accept(self) -> tuple[socket.socket, Any]:
        """`socket.accept`, except that running out of descriptors sheds one connection."""
        try:
            return super().accept()
        except OSError as exc:
            if exc.errno not in _OUT_OF_FDS:
                raise
            self.errors.failed(exc)
            # An idle connection's descriptor is free on the next loop turn, when this
            # socket (still readable) is accepted from again.
            if (self._make_room is None or not self._make_room()) and not self._shed():
                raise  # asyncio backs off for a second and tries again
            # "Nothing more to accept now": the loop waits until the socket is readable again.
            raise BlockingIOError(errno.EAGAIN, "made room or shed a connection") from exc

    def _shed(self) -> bool:
        """Free the reserved descriptor, accept and close one connection, reserve it again."""
        if self._spare is None:
            self._spare = _reserve_fd()
            return False
        os.close(self._spare)
        self._spare = None
        try:
            conn, _ = super().accept()
            conn.close()
        except OSError:
            return False
        finally:
            self._spare = _reserve_fd()
        return True

    def report(self) -> None:
        """Log the failures not yet logged."""
        self.errors.summary()

    def close(self) -> None:
        """Close the socket and the reserved descriptor; log the last count."""
        if getattr(self, "errors", None) is not None:
            self.report()
        if getattr(self, "_spare", None) is not None:
            assert self._spare is not None
            os.close(self._spare)
            self._spare = None
        super().close()


def _reserve_fd() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as far as the OS allows); (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard
    if sys.platform == "darwin" and (hard == resource.RLIM_INFINITY or hard > _DARWIN_OPEN_MAX):
        want = max(soft, _DARWIN_OPEN_MAX)
    if want != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and want <= soft:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError) as exc:
        log.warning("cannot raise the open file limit from %d to %d: %s", soft, want, exc)
        return soft, hard
    return want, hard
