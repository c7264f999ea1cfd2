"""`crew-server --db PATH|URL --host 127.0.0.1 --port N [--dev] [--user-token-file PATH]`:
the reference crew server (SQLite file, or a PostgreSQL database several processes share).

Reads top-down: parse arguments → open the store (migrations run) → make sure a
user token exists (printed once, or written to `--user-token-file`) → serve with
uvicorn until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import ipaddress
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit, urlunsplit

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.h11_impl import H11Protocol

from crew_common.connection_limits import (
    ConnectionLimits,
    SheddingListener,
    close_idlest,
    limited_h11,
    raise_open_file_limit,
)
from crew_common.tcp_listener import tcp_listener
from crew_common.version import VERSION
from crew_server.api.hosts import allowed_hosts
from crew_server.app import EventHub, create_app
from crew_server.clock import Clock
from crew_server.store import Store

# Computers and browsers hold streams open: room for many, and a slow client gets 10 s.
SERVER_LIMITS = ConnectionLimits(max_connections=1000, header_timeout_s=10.0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="crew-server",
        description="The reference crew server: rooms, messages, turns, tasks, reminders "
        "and mutes on one SQLite file, or on a PostgreSQL database that several crew-server "
        "processes share (docs/teams.md). Every /api/ call needs the user token, which is "
        "printed once, at first start (or written to --user-token-file).",
    )
    parser.add_argument("--version", action="version", version=f"crew-server {VERSION}")
    parser.add_argument(
        "--db",
        required=True,
        help="SQLite file (created when missing), :memory:, or a PostgreSQL URL "
        "(postgresql://user@host/dbname; the database must exist, tables are created)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=8765)
    parser.add_argument(
        "--public-url",
        metavar="URL",
        help="the URL Computers and browsers reach this server at (e.g. behind a proxy, or "
        "with --host 0.0.0.0); shown in the Computers page's bootstrap line, and its host "
        "is accepted in Host headers (default: the URL it serves on)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="another host name requests may be addressed to (repeatable); requests with any "
        "other Host get 400. Always allowed: --host, localhost, 127.0.0.1, ::1 and the host "
        "of --public-url",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=SERVER_LIMITS.max_connections,
        metavar="N",
        help="connections served at once (default %(default)s); beyond it a new one closes "
        "the connection idle the longest",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=SERVER_LIMITS.header_timeout_s,
        metavar="SECONDS",
        help="a connection that sends no whole request head for this long (after it opens "
        "or after a response) is closed (default %(default)s)",
    )
    parser.add_argument(
        "--dev",
        action="store_true",
        help="a movable clock (POST /api/dev/clock, with the user token) for tests and "
        "the demo; loopback only. User auth stays on",
    )
    parser.add_argument(
        "--reset-user-token",
        action="store_true",
        help="replace the user token and print the new one (or write it to --user-token-file)",
    )
    parser.add_argument(
        "--user-token-file",
        type=Path,
        metavar="PATH",
        help="when a user token is created (first start, --reset-user-token), write it to "
        "PATH (mode 0600, atomically) instead of printing it; for systemd units and test "
        "harnesses. An existing token is never written again",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        type=str.lower,
        choices=["critical", "error", "warning", "info", "debug"],
        help="how much to log on stderr (default: warning)",
    )
    return parser.parse_args(argv)


def is_loopback(host: str) -> bool:
    """Whether `host` only listens on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, with TCP_NODELAY; `OSError` when the port is taken.

    Bound before anything is printed or stored, so a second server on a busy
    port stops before it mints a user token nobody can use.
    """
    return tcp_listener(host, port)


def listen_failure(host: str, port: int, exc: OSError) -> str:
    """Why host:port cannot be listened on, and what to change: the host or the port."""
    where = f"cannot listen on {host}:{port} ({exc.strerror or exc})"
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"{where}: --host {host} is not an address of this machine; use 127.0.0.1 "
            "(this machine only), 0.0.0.0 (every interface) or one of its own addresses"
        )
    if exc.errno == errno.EACCES:
        return f"{where}: ports below 1024 need privileges; pick another --port (e.g. 8765)"
    return f"{where}; stop what uses it or pick another --port"


def port_number(text: str) -> int:
    """`--port`: 0 (any free port) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port: use 1-65535, or 0 for any")
    return port


def served_url(listener: socket.socket) -> str:
    """The base URL of the server on `listener` (the real port, also for --port 0)."""
    host, port = listener.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def main(argv: list[str] | None = None) -> int:
    """Run the server until stopped; the exit code."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.dev and not is_loopback(args.host):
        print(
            f"crew-server: --dev lets the user move the server clock, so it may only bind "
            f"to loopback, "
            f"not {args.host}; use --host 127.0.0.1 or drop --dev",
            file=sys.stderr,
        )
        return 2
    try:
        listener = listening_socket(args.host, args.port)
    except OSError as exc:
        print(f"crew-server: {listen_failure(args.host, args.port, exc)}", file=sys.stderr)
        return 1
    clock = Clock()
    try:
        store = Store(args.db, clock)
    except Exception as exc:  # any failure to open or migrate the db ends the start
        listener.close()
        print(f"crew-server: cannot open the database {shown(args.db)}: {exc}", file=sys.stderr)
        return 1
    # What keeping the token says is printed after the "serving" line, which comes first.
    said: list[str] = []
    keep = write_token_to(args.user_token_file, said) if args.user_token_file else show_token(said)
    try:
        if args.reset_user_token:
            store.reset_user_token(keep)
        else:
            store.ensure_user_token(keep)
    except OSError as exc:
        store.close()
        listener.close()
        print(
            f"crew-server: cannot write the user token to {args.user_token_file}: {exc}; "
            f"nothing was changed, fix the path and start again",
            file=sys.stderr,
        )
        return 1
    # Only now: "serving" means the database is open and the user token exists.
    print(f"crew-server: serving {served_url(listener)}", flush=True)
    for line in said:
        print(line, flush=True)
    public_url = (args.public_url or served_url(listener)).rstrip("/")
    app = create_app(
        store,
        clock,
        dev=args.dev,
        public_url=public_url,
        allowed_hosts=allowed_hosts(args.host, public_url, args.allowed_host),
    )
    limits = ConnectionLimits(args.max_connections, args.header_timeout)
    raise_open_file_limit()
    server, sock = http_server(app, listener, limits, args.log_level)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        store.close()
    return 0


def http_server(
    app: Starlette, listener: socket.socket, limits: ConnectionLimits, log_level: str
) -> tuple[StoppingServer, SheddingListener]:
    """uvicorn for `app` on `listener` (which it takes over), within `limits`: run it on the socket.

    Idle and slow connections cannot take the server down: the cap, the header
    timeout and the EMFILE handling of crew_common/connection_limits.py.
    """
    config = uvicorn.Config(
        app,
        http=limited_h11(H11Protocol, limits),
        log_level=log_level,
        access_log=False,
        lifespan="on",
        # a safety net: open streams end at once (below), anything else gets 3 s
        timeout_graceful_shutdown=3,
    )
    server = StoppingServer(config, app.state.hub)
    # Out of descriptors: an idle connection goes before a waiting one is shed.
    sock = SheddingListener.take(listener, lambda: close_idlest(server.server_state.connections))
    return server, sock


def shown(location: str) -> str:
    """The database location for messages, without a password a URL may carry."""
    parts = urlsplit(location)
    if parts.password is None:
        return location
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def show_token(said: list[str]) -> Callable[[str], None]:
    """Show a new user token once (into `said`): it is stored only as a hash."""
    return lambda token: said.append(f"user token (shown once, keep it): {token}")


def write_token_to(path: Path, said: list[str]) -> Callable[[str], None]:
    """Write a new user token to `path` (0600, atomically); what to say (where, never what)
    goes into `said`."""

    def keep(token: str) -> None:
        write_private_file(path, token + "\n")
        said.append(f"user token written to {path}")

    return keep


def write_private_file(path: Path, text: str) -> None:
    """`path` holds `text`, readable only by us; a reader sees the old file or the whole new one."""
    # mkstemp creates the file 0600 in the same directory, so the rename is atomic.
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


class StoppingServer(uvicorn.Server):
    """uvicorn, ending the Computers' event streams when asked to stop (SIGINT/SIGTERM)."""

    def __init__(self, config: uvicorn.Config, hub: EventHub) -> None:
        super().__init__(config)
        self.hub = hub

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.hub.close()
        # Not recorded for re-raising (as uvicorn does): a clean stop closes the
        # database and exits 0. A second Ctrl+C still forces the exit.
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True


if __name__ == "__main__":
    sys.exit(main())
