"""A small command-line reader: positionals and `--option value` pairs.

Hand-written instead of argparse so that every mistake prints our one-line
`error: …` (argparse prints usage and exits 2) and the shim starts faster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from crew_shim.errors import UsageError

_DATE_ONLY = re.compile(r"\d{4}-\d{2}-\d{2}")
_CLOCK_ONLY = re.compile(r"\d{1,2}:\d{2}")


class Args:
    """What was given: positionals in order, option values by name (without `--`)."""

    __slots__ = ("help", "options", "positionals")

    def __init__(self) -> None:
        self.positionals: list[str] = []
        self.options: dict[str, list[str]] = {}
        self.help = False

    def option(self, name: str) -> str | None:
        """The value of a one-value option, or None when it was not given."""
        values = self.options.get(name)
        return " ".join(values) if values is not None else None


def parse_args(argv: Sequence[str], *, options: Mapping[str, int], command: str) -> Args:
    """Split `argv` into positionals and options.

    `options` maps an option name (no dashes) to how many values it takes.
    `--at` also takes a second value when the first is a bare date and the
    next is a time (`--at 2026-10-06 09:00`); a two-value option also accepts
    both in one quoted word (`--weekly "mon 09:00"`).
    """
    args = Args()
    tokens = list(argv)
    index = 0
    only_positionals = False
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if only_positionals or not token.startswith("-") or token == "-":
            args.positionals.append(token)
            continue
        if token == "--":
            only_positionals = True
            continue
        if token in ("-h", "--help"):
            args.help = True
            continue
        name, has_inline, inline = token.lstrip("-").partition("=")
        if not token.startswith("--") or name not in options:
            known = ", ".join(f"--{option}" for option in options) or "no options"
            raise UsageError(
                f"crew {command} does not know the option {token.partition('=')[0]} "
                f"(it takes {known}). Run crew {command} --help for how to use it."
            )
        if name in args.options:
            raise UsageError(f"--{name} was given twice. Give it once.")
        wanted = options[name]
        values = _split(inline, wanted) if has_inline else []
        if not values and index < len(tokens):
            values = _split(tokens[index], wanted)
            index += 1
        while len(values) < wanted and index < len(tokens):
            values.append(tokens[index])
            index += 1
        if len(values) < wanted:
            raise UsageError(
                f"--{name} needs {'a value' if wanted == 1 else f'{wanted} values'}. "
                f"Run crew {command} --help for an example."
            )
        if (
            name == "at"
            and _DATE_ONLY.fullmatch(values[0])
            and index < len(tokens)
            and _CLOCK_ONLY.fullmatch(tokens[index])
        ):
            values = [f"{values[0]} {tokens[index]}"]
            index += 1
        args.options[name] = values
    return args


def expect_positionals(args: Args, names: Sequence[str], *, command: str) -> list[str]:
    """Exactly these positionals, in order, or a usage error naming the first missing one."""
    if len(args.positionals) < len(names):
        missing = names[len(args.positionals)]
        raise UsageError(
            f"crew {command} needs {missing}. Run crew {command} --help for how to use it."
        )
    if len(args.positionals) > len(names):
        extra = " ".join(args.positionals[len(names) :])
        raise UsageError(
            f'crew {command} got more than it takes: "{extra}". '
            f"Quote a value with spaces, or run crew {command} --help."
        )
    return list(args.positionals)


def _split(word: str, wanted: int) -> list[str]:
    """One word as the values of an option: `"mon 09:00"` gives two when two are wanted."""
    if wanted > 1 and " " in word.strip():
        return word.split(maxsplit=wanted - 1)
    return [word]
