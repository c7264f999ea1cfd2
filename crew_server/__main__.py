"""`crew-server --db PATH --host 127.0.0.1 --port N [--dev]`: the reference crew server.

Reads top-down: parse arguments → open the store (migrations run) → make sure a
user token exists (printed once) → serve with uvicorn until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import socket
import sys
from types import FrameType

import uvicorn

from crew_common.version import VERSION
from crew_server.app import EventHub, create_app
from crew_server.clock import Clock
from crew_server.store import Store


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="crew-server",
        description="The reference crew server: rooms, messages, turns, tasks, reminders "
        "and mutes on one SQLite file. The user token is printed once, at first start.",
    )
    parser.add_argument("--version", action="version", version=f"crew-server {VERSION}")
    parser.add_argument(
        "--db", required=True, help="SQLite file (created when missing), or :memory:"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--dev",
        action="store_true",
        help="no user auth and a movable clock (POST /api/dev/clock); loopback only",
    )
    parser.add_argument(
        "--reset-user-token",
        action="store_true",
        help="replace the user token and print the new one",
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
    """A socket bound to host:port, as uvicorn would bind it; `OSError` when the port is taken.

    Bound before anything is printed or stored, so a second server on a busy
    port stops before it mints a user token nobody can use.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
    except OSError:
        listener.close()
        raise
    return listener


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
            f"crew-server: --dev turns user auth off, so it may only bind to loopback, "
            f"not {args.host}; use --host 127.0.0.1 or drop --dev",
            file=sys.stderr,
        )
        return 2
    try:
        listener = listening_socket(args.host, args.port)
    except OSError as exc:
        print(
            f"crew-server: cannot listen on {args.host}:{args.port} ({exc.strerror}); "
            f"stop what uses it or pick another --port",
            file=sys.stderr,
        )
        return 1
    print(f"crew-server: serving {served_url(listener)}", flush=True)
    clock = Clock()
    try:
        store = Store(args.db, clock)
    except Exception as exc:  # any failure to open or migrate the db ends the start
        listener.close()
        print(f"crew-server: cannot open the database {args.db}: {exc}", file=sys.stderr)
        return 1
    if args.reset_user_token:
        print(f"user token (shown once): {store.reset_user_token()}", flush=True)
    elif not args.dev:
        token = store.ensure_user_token()
        if token is not None:
            print(f"user token (shown once, keep it): {token}", flush=True)
    app = create_app(store, clock, dev=args.dev)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        lifespan="on",
        # a safety net: open streams end at once (below), anything else gets 3 s
        timeout_graceful_shutdown=3,
    )
    server = StoppingServer(config, app.state.hub)
    try:
        server.run(sockets=[listener])
    finally:
        store.close()
    return 0


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
