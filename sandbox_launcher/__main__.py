"""`crew-launcher serve …` (started by the Computer) and `crew-launcher sandbox … -- CMD…`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from crew_common.egress import DEFAULT_MODE, MODES, EgressError, EgressPolicy
from crew_common.version import VERSION
from sandbox_launcher.bwrap import LinuxMode
from sandbox_launcher.limits import MIB, TurnLimits


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crew-launcher", description="The crew sandbox launcher: runs engines sandboxed."
    )
    parser.add_argument("--version", action="version", version=f"crew-launcher {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="serve the launcher API on a Unix socket (the bearer secret is stdin's first line)",
    )
    serve.add_argument("--crew-home", required=True, type=Path)
    serve.add_argument("--run-id", required=True, help="the Computer's run: runtime/<run-id>/")
    serve.add_argument("--socket", required=True, type=Path)
    serve.add_argument("--mode", choices=[m.value for m in LinuxMode], default=None)
    serve.add_argument("--opencode", default=None, help="path of the opencode executable")
    serve.add_argument(
        "--read-only-root",
        action="append",
        default=[],
        help="a directory every agent may read (the bootstrap's read_only_roots)",
    )
    _limit_arguments(serve)
    sandbox = sub.add_parser(
        "sandbox", help="run one command under the policy an agent gets (HOME, CREW_HOME from env)"
    )
    sandbox.add_argument("--mode", choices=[m.value for m in LinuxMode], default=None)
    sandbox.add_argument("--agent-dir", required=True)
    sandbox.add_argument("--runtime-dir", required=True)
    sandbox.add_argument(
        "--read-dir", action="append", default=[], help="another directory to keep readable"
    )
    sandbox.add_argument(
        "--loopback-port",
        type=int,
        action="append",
        default=[],
        help="a host-loopback TCP port reachable inside (Linux; repeatable), as a run's",
    )
    _connection_argument(sandbox)
    sandbox.add_argument(
        "--egress",
        choices=MODES,
        default=DEFAULT_MODE,
        help="where the command may connect, as an agent's egress mode (Linux; default public)",
    )
    sandbox.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="RULE",
        help="with --egress allow: a host name, *.name, address or range, each optionally "
        ":PORT (repeatable), as an agent's allow list",
    )
    sandbox.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS…]")
    return parser


def _limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The per-run resource limits (sandbox_launcher.limits); defaults from `TurnLimits`."""
    default = TurnLimits()
    parser.add_argument(
        "--max-processes",
        type=int,
        default=default.max_processes,
        help="processes and threads one run may have",
    )
    parser.add_argument(
        "--memory-mb",
        type=int,
        default=default.memory_bytes // MIB,
        help="memory of one run, in MiB (enforced where a cgroup is available)",
    )
    parser.add_argument(
        "--shm-mb", type=int, default=default.shm_bytes // MIB, help="size of /dev/shm, MiB"
    )
    parser.add_argument(
        "--disk-mb",
        type=int,
        default=default.disk_bytes // MIB,
        help="disk one agent's directories may use, in MiB (a watch; limits.py)",
    )
    _connection_argument(parser)


def _connection_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-connections",
        type=int,
        default=TurnLimits().max_connections,
        help="TCP connections one run may hold at a time (Linux, its own network namespace)",
    )


def _limits(args: argparse.Namespace) -> TurnLimits:
    for name in ("max_processes", "memory_mb", "shm_mb", "disk_mb", "max_connections"):
        if getattr(args, name) < 1:
            raise SystemExit(f"crew-launcher: --{name.replace('_', '-')} must be at least 1")
    return TurnLimits(
        max_processes=args.max_processes,
        memory_bytes=args.memory_mb * MIB,
        shm_bytes=args.shm_mb * MIB,
        disk_bytes=args.disk_mb * MIB,
        max_connections=args.max_connections,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `crew-launcher` console script."""
    args = _parser().parse_args(argv)
    mode = LinuxMode(args.mode) if args.mode else None
    logging.basicConfig(  # times as in the Computer's log, which this one joins
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s crew-launcher %(levelname)s %(message)s",
    )
    if args.command == "serve":
        from sandbox_launcher.server import LauncherExit, serve

        try:
            return serve(
                args.crew_home,
                args.run_id,
                args.socket,
                args.opencode,
                mode,
                tuple(args.read_only_root),
                _limits(args),
            )
        except LauncherExit as exc:
            sys.stderr.write(f"crew-launcher: {exc}\n")
            return 2
    from sandbox_launcher.sandbox_command import run_sandboxed

    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.max_connections < 1:
        raise SystemExit("crew-launcher: --max-connections must be at least 1")
    try:
        egress = EgressPolicy.parse({"mode": args.egress, "allow": args.allow})
    except EgressError as exc:
        raise SystemExit(f"crew-launcher: {exc}") from None
    return run_sandboxed(
        mode,
        args.agent_dir,
        args.runtime_dir,
        args.read_dir,
        command,
        args.loopback_port,
        args.max_connections,
        egress,
    )


if __name__ == "__main__":
    sys.exit(main())
