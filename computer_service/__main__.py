"""`crew-computer` / `python -m computer_service`: read the bootstrap, run the Computer.

Two ways to start it:
- `crew-computer` reads the bootstrap JSON from stdin: one line from a pipe (the
  desktop app's way; closing the pipe then means "stop"), or a whole regular
  file (`crew-computer < boot.json`, systemd's `StandardInput=file:`);
- `crew-computer run --config FILE` reads it from FILE, with the token from the
  file FILE names or `$CREW_COMPUTER_TOKEN` (for a person, systemd or launchd).

Exit status: 0 after an orderly stop (stdin pipe closed, SIGTERM, SIGINT); 1 when
the bootstrap is bad, the sandbox launcher cannot start (a broken
installation: `ready` is never printed), the server refuses the connection, this
run cannot be prepared, or it cannot go on (`opencode models` gives no list, the server
refuses the model list or the event stream) — after an orderly stop, with a
one-line reason on stderr (never the token); 2 for a usage error; 130 for
Ctrl+C before the Computer started.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
import sys
import textwrap
from pathlib import Path
from typing import NoReturn

import anyio

from computer_service.bootstrap import (
    MAX_BOOTSTRAP_BYTES,
    TOKEN_ENV,
    Bootstrap,
    BootstrapError,
    load_config,
    parse_bootstrap,
)
from computer_service.parts_protocol import StartupFailed
from computer_service.service import ComputerService
from crew_common.connection_limits import raise_open_file_limit
from crew_common.version import VERSION

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _optional_fields() -> str:
    """Every optional bootstrap field, from the model itself: the help never lags behind."""
    names = [n for n, f in Bootstrap.model_fields.items() if not f.is_required()]
    return textwrap.fill(", ".join(names), width=78, break_on_hyphens=False)


_EPILOG = f"""\
The bootstrap is a JSON object: server_url and token (required), and optional:
{_optional_fields()}
(README, "Configuration: the bootstrap line", says what each means). The config of
`run --config` holds the same fields, but instead of token a token_file (a path,
mode 0600; relative paths are relative to the config's directory), or the token
is in ${TOKEN_ENV}.

Environment: CREW_HOME (the crew home when the bootstrap names none; default
~/.crew), CREW_LOG_LEVEL ({", ".join(LOG_LEVELS)}; default info).

Stop it with SIGTERM or Ctrl+C; a Computer started with its bootstrap on a
pipe also stops when the pipe closes.
"""


def parser() -> argparse.ArgumentParser:
    """The command line of `crew-computer`."""
    command_line = argparse.ArgumentParser(
        prog="crew-computer",
        usage="%(prog)s [-h] [--version]  < bootstrap.json\n       %(prog)s run --config FILE\n"
        "       %(prog)s status [--json]\n       %(prog)s follow [AGENT]",
        description="The Crew Computer: runs this machine's agents for a crew server. "
        "Without a command it reads the bootstrap JSON from stdin (one line from a "
        "pipe, or a whole file).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command_line.add_argument("--version", action="version", version=f"crew-computer {VERSION}")
    sub = command_line.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser(
        "run",
        prog="crew-computer run",  # else argparse puts the top usage in front
        help="run with the bootstrap in a config file (for systemd, launchd or a terminal)",
        description="Run the Computer with its bootstrap in a JSON config file; "
        f"the token comes from the config's token_file or ${TOKEN_ENV}.",
    )
    run.add_argument("--config", required=True, type=Path, metavar="FILE")
    home_help = "the crew home of the Computer to ask (default: $CREW_HOME, else ~/.crew)"
    status = sub.add_parser(
        "status",
        prog="crew-computer status",
        help="show the running Computer and its agents (like `docker ps`)",
        description="Show the running Computer (server, connection, version, sandbox) and "
        "each agent: state, current turn and its age, last result, tokens and cost today. "
        "Exit status 1 when no Computer runs on the crew home.",
    )
    status.add_argument("--json", action="store_true", help="print /health and /agents as JSON")
    status.add_argument("--crew-home", type=Path, metavar="DIR", help=home_help)
    follow = sub.add_parser(
        "follow",
        prog="crew-computer follow",
        help="print the agents' turns as they happen (Ctrl+C to stop)",
        description="Print live turns readably: steps, tool calls with a short input and "
        "output, the agent's text, and tokens and cost when a turn ends. Reconnects (with "
        "Last-Event-ID) when the Computer restarts.",
    )
    follow.add_argument("agent", nargs="?", metavar="AGENT", help="only this agent (@handle or id)")
    follow.add_argument("--crew-home", type=Path, metavar="DIR", help=home_help)
    return command_line


def read_bootstrap_line(fd: int) -> bytes:
    """Read stdin up to the first newline, unbuffered: the rest of stdin stays ours to watch."""
    data = b""
    while b"\n" not in data and len(data) <= MAX_BOOTSTRAP_BYTES:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]


def read_bootstrap(fd: int) -> bytes:
    """The bootstrap on stdin: a regular file whole (it may be pretty-printed), else one line."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return read_bootstrap_line(fd)
    data = b""
    while len(data) <= MAX_BOOTSTRAP_BYTES:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data.strip()


def main(argv: list[str] | None = None) -> None:
    """The console script: exits 0 after an orderly stop, else 1, 2 or 130 with a reason."""
    args = parser().parse_args(argv)
    if args.command in ("status", "follow"):
        from computer_service.watch import run_command

        sys.exit(
            run_command(
                args.command,
                args.crew_home,
                as_json=getattr(args, "json", False),
                agent=getattr(args, "agent", None),
            )
        )
    _configure_logging()
    try:
        sys.exit(_run(args))
    except KeyboardInterrupt:
        # Ctrl+C before the service watches signals itself (e.g. waiting for the bootstrap).
        _fail("interrupted before the Computer started", status=130)


def _run(args: argparse.Namespace) -> int:
    stdin_fd: int | None = None
    if args.command == "run":
        try:
            bootstrap = load_config(args.config, os.environ)
        except BootstrapError as exc:
            _fail(str(exc))
    else:
        stdin_fd = sys.stdin.fileno()
        bootstrap = _bootstrap_from_stdin(stdin_fd)
    # Imported here: the engine side is only needed once the bootstrap is valid.
    from computer_service.launcher_client import LauncherUnavailable
    from computer_service.launcher_process import check_launcher_starts
    from computer_service.parts import LocalParts

    try:
        # Before `ready`: a Computer whose launcher cannot start can run no agent.
        check_launcher_starts()
    except LauncherUnavailable as exc:
        _fail(str(exc))
    # Each connection, launcher run and agent file costs a descriptor: take what we may.
    raise_open_file_limit()
    parts = LocalParts(bootstrap)
    service = ComputerService(bootstrap, parts, stdout=sys.stdout.buffer, stdin_fd=stdin_fd)
    try:
        return anyio.run(service.serve)
    except StartupFailed as exc:
        _fail(str(exc))


def _bootstrap_from_stdin(fd: int) -> Bootstrap:
    if os.isatty(fd):
        # A person ran it in a terminal: say what it waits for instead of hanging silently.
        sys.stderr.write(
            "crew-computer: waiting for the bootstrap JSON line on stdin "
            "(Ctrl+C to quit; crew-computer --help shows other ways to start)\n"
        )
        sys.stderr.flush()
    try:
        return parse_bootstrap(read_bootstrap(fd))
    except (BootstrapError, OSError) as exc:
        _fail(str(exc))


def _configure_logging() -> None:
    level = os.environ.get("CREW_LOG_LEVEL", "info").lower()
    if level not in LOG_LEVELS:
        _fail(f"CREW_LOG_LEVEL is {level!r}; use one of {', '.join(LOG_LEVELS)}", status=2)
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _fail(reason: str, status: int = 1) -> NoReturn:
    sys.stderr.write(f"crew-computer: {reason.splitlines()[0] if reason else 'failed'}\n")
    sys.stderr.flush()
    sys.exit(status)


if __name__ == "__main__":
    main()
