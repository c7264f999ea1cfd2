"""The one way the Computer reaches an agent's warm server: HTTP on 127.0.0.1, owner-checked.

On Linux the server listens inside its sandbox's own network namespace and
the launcher's pasta publishes that port on the host's 127.0.0.1; elsewhere
the server listens there itself. Either way the port is on the host's
loopback, where another local process could listen once its holder is gone.
So before every new connection `check_owner` makes sure that every socket
listening on that port (in our network namespace: the one we connect in) is
a socket of the process the launcher named (`ServerInfo.listener_pid`): the
listener's inode must be among the descriptors of `/proc/<pid>/fd`, and
`<pid>` must still be that process (same start time, so a reused pid is told
apart). A turn or the server's password never goes to a port something else
owns.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpcore
import httpx

from crew_common.procfs import process_start_time

# The addresses a connection to 127.0.0.1:port can land on.
_IPV4 = {"0100007F", "00000000"}  # 127.0.0.1, 0.0.0.0 as /proc/net/tcp prints them (little endian)
_IPV6 = {
    "00000000000000000000000000000000",  # ::
    "0000000000000000FFFF00000100007F",  # ::ffff:127.0.0.1
}
_LISTEN = "0A"
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 30.0


class NotTheServer(Exception):
    """The port is not (or no longer) the warm server's; nothing was sent."""


@dataclass(frozen=True)
class ServerAddress:
    """Where an agent's server listens, and which process it must be."""

    pid: int
    start_time: int
    port: int
    password: str = field(repr=False)

    @property
    def authorization(self) -> str:
        token = base64.b64encode(f"opencode:{self.password}".encode()).decode()
        return f"Basic {token}"


def listening_inodes(port: int, proc_net: str = "/proc/self/net") -> set[int]:
    """Inodes of the sockets listening on `port` at an address 127.0.0.1 reaches."""
    found: set[int] = set()
    for name, addresses in (("tcp", _IPV4), ("tcp6", _IPV6)):
        try:
            with open(f"{proc_net}/{name}", encoding="ascii", errors="replace") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue  # no IPv6 here
        found |= _listeners(rows, port, addresses)
    return found


def _listeners(rows: Iterable[str], port: int, addresses: set[str]) -> set[int]:
    found = set()
    for row in rows:
        fields = row.split()
        if len(fields) < 10 or fields[3] != _LISTEN:
            continue
        address, _, port_hex = fields[1].partition(":")
        if address.upper() in addresses and int(port_hex, 16) == port:
            found.add(int(fields[9]))
    return found


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets among the process's open descriptors."""
    found: set[int] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def check_owner(address: ServerAddress) -> None:
    """Raise `NotTheServer` unless every listener on the port is the server's own socket."""
    if process_start_time(address.pid) != address.start_time:
        raise NotTheServer(f"the warm server (pid {address.pid}) is gone")
    listeners = listening_inodes(address.port)
    if not listeners:
        raise NotTheServer(f"nothing listens on port {address.port} any more")
    if not listeners <= socket_inodes(address.pid):
        raise NotTheServer(
            f"port {address.port} is held by a process other than the warm server "
            f"(pid {address.pid}); nothing was sent to it"
        )


class _OwnerCheckedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, checking the owner before every TCP connection."""

    def __init__(self, address: ServerAddress) -> None:
        self._address = address
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        if host != "127.0.0.1" or port != self._address.port:
            raise NotTheServer(f"refusing to connect to {host}:{port}: not the warm server")
        check_owner(self._address)
        return await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise NotTheServer("the warm server is reached over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def server_client(address: ServerAddress, directory: str) -> httpx.AsyncClient:
    """An HTTP client of the server: every new connection owner-checked, every request
    authenticated and scoped to the agent's work directory."""
    transport = httpx.AsyncHTTPTransport(retries=0)
    # httpx takes no network backend: its pool is replaced by the same pool with ours.
    transport._pool = httpcore.AsyncConnectionPool(
        max_connections=8,
        max_keepalive_connections=4,
        keepalive_expiry=30.0,
        network_backend=_OwnerCheckedBackend(address),
    )
    return httpx.AsyncClient(
        transport=transport,
        base_url=f"http://127.0.0.1:{address.port}",
        # Uncompressed: every answer is read with a size cap as it arrives.
        headers={"Authorization": address.authorization, "Accept-Encoding": "identity"},
        params={"directory": directory},
        timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
        trust_env=False,  # never a proxy from the environment
    )
