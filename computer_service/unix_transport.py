"""An httpx transport over a Unix socket on asyncio's own streams (`unix_transport`).

httpx's `uds=` transport reads through anyio's raw-socket stream, and there a
cancelled read can still be completed by the selector in the same loop
iteration: the socket's reader callback calls `set_result` on the cancelled
future and asyncio logs `InvalidStateError` from a callback (anyio 4.16,
`_RawSocketMixin._wait_until_readable`; a sibling of anyio#1267). It is
harmless, but the Computer cancels reads from the launcher on purpose — a step
guard, a Stop, a timeout — and each time the log would show an error, and a
test under the anyio plugin fails at random. asyncio's `StreamReader` sits on
a transport and is cancelled cleanly, so the launcher's client reads through it.
"""

from __future__ import annotations

import asyncio
import select
import socket
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

import httpcore
import httpx

T = TypeVar("T")


async def _within(awaitable: Awaitable[T], timeout: float | None) -> T:
    """`awaitable`, given `timeout` seconds (None: no limit); TimeoutError past it.

    `asyncio.timeout`, not `wait_for`: Python 3.11's `wait_for` swallows a cancel that
    arrives as the inner read completes (gh-86296), and the cancelled read went on."""
    async with asyncio.timeout(timeout):
        return await awaitable


class _Stream(httpcore.AsyncNetworkStream):
    """One connection: asyncio's reader and writer of a Unix socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            return await _within(self._reader.read(max_bytes), timeout)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout("no answer on the Unix socket in time") from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            await _within(self._writer.drain(), timeout)
        except TimeoutError as exc:
            raise httpcore.WriteTimeout("the Unix socket took no more in time") from exc
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        # At once, like closing the socket (httpcore closes a connection it is done
        # with, or one a cancel broke): never wait on a peer that stopped reading.
        self._writer.transport.abort()

    def get_extra_info(self, info: str) -> Any:
        sock: socket.socket | None = self._writer.get_extra_info("socket")
        if info == "socket":
            return sock
        if info == "is_readable":
            # httpcore asks before reusing an idle connection: readable means the peer
            # closed it (or sent what nobody asked for), so it is not reused.
            if self._reader.at_eof() or sock is None or sock.fileno() < 0:
                return True
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(0))
        return None


class _Backend(httpcore.AsyncNetworkBackend):
    """Connects to Unix sockets only, with asyncio's streams."""

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            reader, writer = await _within(asyncio.open_unix_connection(path), timeout)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"{path}: no connection in time") from exc
        except OSError as exc:
            raise httpcore.ConnectError(f"{path}: {exc}") from exc
        return _Stream(reader, writer)

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("this transport connects to a Unix socket only")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def unix_transport(path: str) -> httpx.AsyncHTTPTransport:
    """An httpx transport to the Unix socket at `path`, read with asyncio's streams."""
    transport = httpx.AsyncHTTPTransport(uds=path, verify=False)
    # httpx builds its pool on httpcore's automatic backend (anyio's streams); the same
    # pool, settings as httpx's defaults (HTTP/1.1), on ours. httpx's own attribute.
    transport._pool = httpcore.AsyncConnectionPool(uds=path, network_backend=_Backend())
    return transport
