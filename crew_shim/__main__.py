"""`crew`: the command agents run to talk to the crew server.

Startup time matters (it runs many times per turn), so each command's module
is imported only when that command runs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from crew_shim.errors import CrewError, UsageError

_COMMANDS = ("reply", "task", "remind", "mute", "unmute")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `crew` command; print its outcome; return the exit code (0 or 1)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(args)
    except CrewError as exc:
        sys.stderr.write(error_line(exc.line))
        return 1


def error_line(line: str) -> str:
    """`error: <what happened>. <what to do next>.` on one line."""
    text = " ".join(line.split())
    if not text.endswith((".", "?", "!")):
        text += "."
    return f"error: {text}\n"


def _dispatch(args: list[str]) -> int:
    if args[:1] == ["--version"]:
        from crew_shim.version import VERSION

        sys.stdout.write(f"crew {VERSION}\n")
        return 0
    if not args or args[0] in ("-h", "--help", "help"):
        from crew_shim.help import MAIN_HELP

        if not args:
            raise UsageError("crew needs a command. Run crew --help to see them")
        sys.stdout.write(MAIN_HELP)
        return 0
    command, rest = args[0], args[1:]
    if command == "reply":
        from crew_shim import reply

        # sys.stdin is None when the process was started with fd 0 closed.
        stdin = sys.stdin.buffer if sys.stdin is not None else None
        return reply.run(rest, stdin=stdin, stdout=sys.stdout)
    if command == "task":
        from crew_shim import tasks

        return tasks.run(rest, stdout=sys.stdout)
    if command == "remind":
        from crew_shim import reminders

        return reminders.run(rest, stdout=sys.stdout)
    if command == "mute":
        from crew_shim import mutes

        return mutes.run_mute(rest, stdout=sys.stdout)
    if command == "unmute":
        from crew_shim import mutes

        return mutes.run_unmute(rest, stdout=sys.stdout)
    raise UsageError(
        f'crew has no command "{command}" (it has {", ".join(_COMMANDS)}). Run crew --help to see them'
    )


if __name__ == "__main__":
    sys.exit(main())
