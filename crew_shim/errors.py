"""The failures `crew` reports: each one prints as one English line and exits 1."""

from __future__ import annotations


class CrewError(Exception):
    """A failure the agent can act on.

    `line` is printed after `error: ` on stderr; it says what happened and
    what to do next, both as sentences ending with a full stop.
    """

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


class UsageError(CrewError):
    """The command line is wrong (unknown command, missing or extra argument)."""


class InputError(CrewError):
    """A value failed a local check (an id, a body, a time); nothing was sent."""


class ServerUnreachable(CrewError):
    """The crew server could not be reached; nothing was sent."""


class ServerTimeout(CrewError):
    """The crew server did not answer in time; the request may have taken effect."""


class ServerRefused(CrewError):
    """The crew server answered with an error (translated or its own refusal text)."""
