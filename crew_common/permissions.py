"""An agent's permission policy: which tool calls run, which ask the person, which are refused (issue 24).

One definition for the server (which stores it with the agent, refuses a bad
one with a reason and adds a rule when a person answers "Always") and the
Computer (which turns it into OpenCode's `permission` config). Pure.

The user's form, stored on the server and shown everywhere:

    {"preset": "careful",
     "rules": [{"tool": "bash", "pattern": "git push*", "action": "ask"}],
     "ask_timeout_s": 600}

- `tool`: an OpenCode permission name (`bash`, `edit`, `read`, `webfetch`...,
  `TOOLS`), `*` for every tool, or an MCP tool (`server_tool`, `*` allowed:
  `github_*`).
- `pattern`: a glob over what the tool is asked to do (for `bash` the command,
  for `edit`/`read`/`external_directory` the path, for `webfetch` the URL):
  `*` matches anything, `?` one character, everything else is literal;
  OpenCode's own matcher decides (a pattern ending in ` *` also matches the
  command without arguments: `git push *` matches `git push`).
- `action`: `allow`, `ask` (an approval card in the room; the turn waits up to
  `ask_timeout_s`, then the call is refused) or `deny` (refused, and the agent
  is told why and goes on).

Which rule decides: the preset's rules, then the user's, grouped by tool —
the `*` tool's rules first, then each tool in the order it first appears,
each tool's rules in their order — and the **last** rule that matches a call
decides. So a rule for one tool beats a `*` rule, and a later rule beats an
earlier one for the same tool. `normalised()` stores the rules in that order,
so the stored list reads exactly as it is evaluated; it is also the order of
OpenCode's own evaluation of the config object `to_opencode` writes.

The `crew` command is always allowed (`CREW_RULES`, added last): it is how an
agent answers, and no rule can take it away.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Action = Literal["allow", "ask", "deny"]
ACTIONS: tuple[Action, ...] = ("allow", "ask", "deny")

# OpenCode 1.18's permission names (its config schema).
TOOLS = (
    "bash",
    "codesearch",
    "doom_loop",
    "edit",
    "external_directory",
    "glob",
    "grep",
    "list",
    "lsp",
    "read",
    "skill",
    "task",
    "todoread",
    "todowrite",
    "webfetch",
    "websearch",
)
# Tools OpenCode's config takes one action for, never patterns (its 1.18.33 config schema:
# `todowrite`, `question`, `webfetch`, `websearch` and `doom_loop` take only an action; every
# other key, named or not, takes an action or a pattern object).
ACTION_ONLY = ("doom_loop", "todowrite", "webfetch", "websearch")
MAX_RULES = 200
MAX_PATTERN_LENGTH = 300
DEFAULT_ASK_TIMEOUT_S = 600
MIN_ASK_TIMEOUT_S = 10
MAX_ASK_TIMEOUT_S = 86_400
DEFAULT_PRESET = "autonomous"

_MCP_TOOL = re.compile(r"^[a-z0-9][a-z0-9_.*-]{0,127}$")
_REGEX_HINTS = ("(?", "\\d", "\\s", "\\w", "[^", ".+")


class PolicyError(ValueError):
    """A policy that cannot be used; the message says what is wrong and how to write it."""


@dataclass(frozen=True)
class PermissionRule:
    """One rule: calls of `tool` whose subject matches `pattern` get `action`."""

    tool: str
    pattern: str
    action: Action

    def as_dict(self) -> dict[str, str]:
        return {"tool": self.tool, "pattern": self.pattern, "action": self.action}


def _rules(*triples: tuple[str, str, Action]) -> tuple[PermissionRule, ...]:
    return tuple(PermissionRule(t, p, a) for t, p, a in triples)


# Named for what they mean; `autonomous` is what every agent had before issue 24.
PRESETS: dict[str, tuple[PermissionRule, ...]] = {
    "autonomous": _rules(("*", "*", "allow")),
    # Ask before what cannot be taken back: publishing, pushing, touching files
    # outside work/ (OpenCode asks `external_directory` for any path outside the
    # project, also for the paths a bash command such as `rm` names).
    "careful": _rules(
        ("*", "*", "allow"),
        ("external_directory", "*", "ask"),
        ("bash", "git push *", "ask"),
        ("bash", "npm publish *", "ask"),
        ("bash", "yarn publish *", "ask"),
        ("bash", "pnpm publish *", "ask"),
        ("bash", "cargo publish *", "ask"),
        ("bash", "twine upload *", "ask"),
        ("bash", "gh release *", "ask"),
        ("bash", "gh pr merge *", "ask"),
        ("bash", "docker push *", "ask"),
    ),
    # Reads and looks; changes nothing (edits refused, commands other than
    # read-only ones refused, `crew` always allowed).
    "read-only": _rules(
        ("*", "*", "allow"),
        ("edit", "*", "deny"),
        ("bash", "*", "deny"),
        *(
            ("bash", command, "allow")
            for command in (
                "ls *",
                "cat *",
                "head *",
                "tail *",
                "wc *",
                "grep *",
                "rg *",
                "find *",
                "pwd",
                "git status *",
                "git log *",
                "git diff *",
                "git show *",
            )
        ),
        ("external_directory", "*", "deny"),
    ),
}
PRESET_MEANINGS = {
    "autonomous": "every tool runs without asking (as before approvals existed)",
    "careful": "ask before pushing, publishing, merging or touching files outside work/",
    "read-only": "reads and looks; edits and other commands are refused",
}
CREW_RULES = _rules(("bash", "crew *", "allow"))


@dataclass(frozen=True)
class PermissionPolicy:
    """An agent's policy in the user's form, checked (`parse`) and ordered (`normalised`)."""

    preset: str = DEFAULT_PRESET
    rules: tuple[PermissionRule, ...] = ()
    ask_timeout_s: int = DEFAULT_ASK_TIMEOUT_S

    @classmethod
    def parse(cls, raw: Any) -> PermissionPolicy:
        """The policy of a user's form (None: the default); `PolicyError` says what is wrong."""
        if raw is None:
            return cls()
        if isinstance(raw, PermissionPolicy):
            return raw
        if not isinstance(raw, Mapping):
            raise PolicyError(
                'a permission policy is an object: {"preset": "careful", "rules": [...]}'
            )
        unknown = sorted(set(raw) - {"preset", "rules", "ask_timeout_s"})
        if unknown:
            raise PolicyError(
                f"unknown field(s) {', '.join(unknown)}; a policy has preset, rules, ask_timeout_s"
            )
        preset = raw.get("preset")
        if preset is None:
            preset = DEFAULT_PRESET
        if not isinstance(preset, str) or preset not in PRESETS:
            raise PolicyError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        timeout = raw.get("ask_timeout_s", DEFAULT_ASK_TIMEOUT_S)
        if timeout is None:
            timeout = DEFAULT_ASK_TIMEOUT_S
        if isinstance(timeout, bool) or not isinstance(timeout, int):
            raise PolicyError("ask_timeout_s is a whole number of seconds")
        if not MIN_ASK_TIMEOUT_S <= timeout <= MAX_ASK_TIMEOUT_S:
            raise PolicyError(
                f"ask_timeout_s must be between {MIN_ASK_TIMEOUT_S} and {MAX_ASK_TIMEOUT_S} "
                f"seconds, not {timeout}"
            )
        rules_raw = raw.get("rules")
        if rules_raw is None:
            rules_raw = []
        if not isinstance(rules_raw, list):
            raise PolicyError("rules is a list of {tool, pattern, action} objects")
        if len(rules_raw) > MAX_RULES:
            raise PolicyError(f"at most {MAX_RULES} rules, not {len(rules_raw)}")
        rules = tuple(parse_rule(rule, index) for index, rule in enumerate(rules_raw, 1))
        return cls(preset=preset, rules=rules, ask_timeout_s=timeout).normalised()

    def normalised(self) -> PermissionPolicy:
        """The same policy with its rules in the order they are evaluated in (module docstring)."""
        return PermissionPolicy(self.preset, grouped(self.rules), self.ask_timeout_s)

    def as_dict(self) -> dict[str, Any]:
        """The user's form, as stored and shown."""
        return {
            "preset": self.preset,
            "rules": [rule.as_dict() for rule in self.rules],
            "ask_timeout_s": self.ask_timeout_s,
        }

    def effective(self) -> tuple[PermissionRule, ...]:
        """Every rule in evaluation order: the preset's, the user's, then `crew`'s."""
        return (*grouped((*PRESETS[self.preset], *self.rules)), *CREW_RULES)

    def asks(self) -> bool:
        """True when some call may ask the person."""
        return any(rule.action == "ask" for rule in self.effective())

    def with_always(self, tool: str, patterns: Iterable[str]) -> PermissionPolicy:
        """The policy after a person answered "Always": an `allow` rule per pattern, last."""
        added = tuple(PermissionRule(tool, p, "allow") for p in patterns if p)
        kept = tuple(r for r in self.rules if r not in added)
        return PermissionPolicy(self.preset, grouped((*kept, *added)), self.ask_timeout_s)

    def to_opencode(self, *, can_ask: bool = True) -> dict[str, Any]:
        """OpenCode's `permission` config object; `can_ask=False` turns each `ask` into `deny`
        (an engine that cannot wait for the person)."""
        config: dict[str, Any] = {}
        for rule in self.effective():
            action = rule.action if can_ask or rule.action != "ask" else "deny"
            patterns = config.setdefault(rule.tool, {})
            patterns.pop(rule.pattern, None)  # a later rule for the same pattern wins: move it last
            patterns[rule.pattern] = action
        # One action, not patterns, where that is all there is (OpenCode's schema wants it so
        # for ACTION_ONLY tools).
        return {
            tool: patterns["*"] if list(patterns) == ["*"] else patterns
            for tool, patterns in config.items()
        }

    def to_ruleset(self, *, can_ask: bool = True) -> list[dict[str, str]]:
        """The same rules as OpenCode's session ruleset (`{permission, pattern, action}`)."""
        return [
            {"permission": tool, "pattern": pattern, "action": action}
            for tool, patterns in self.to_opencode(can_ask=can_ask).items()
            for pattern, action in (
                patterns.items() if isinstance(patterns, dict) else [("*", patterns)]
            )
        ]


def grouped(rules: Iterable[PermissionRule]) -> tuple[PermissionRule, ...]:
    """`rules` grouped by tool: `*` first, then each tool where it first appears, order kept."""
    by_tool: dict[str, list[PermissionRule]] = {"*": []}
    for rule in rules:
        by_tool.setdefault(rule.tool, []).append(rule)
    return tuple(rule for group in by_tool.values() for rule in group)


def parse_rule(raw: Any, index: int = 1) -> PermissionRule:
    """One rule of the user's form; `PolicyError` names the rule and what is wrong."""
    where = f"rule {index}"
    if not isinstance(raw, Mapping):
        raise PolicyError(f'{where}: a rule is {{"tool": ..., "pattern": ..., "action": ...}}')
    unknown = sorted(set(raw) - {"tool", "pattern", "action"})
    if unknown:
        raise PolicyError(f"{where}: unknown field(s) {', '.join(unknown)}")
    tool, pattern, action = raw.get("tool"), raw.get("pattern", "*"), raw.get("action")
    if not isinstance(tool, str) or not tool:
        raise PolicyError(f"{where}: tool is required (bash, edit, read, ..., or *)")
    check_tool(tool, where)
    if action not in ACTIONS:
        raise PolicyError(f"{where}: action must be allow, ask or deny, not {action!r}")
    if not isinstance(pattern, str):
        raise PolicyError(f"{where}: pattern is a text (a glob such as 'git push *')")
    check_pattern(pattern, where)
    if tool in ACTION_ONLY and pattern != "*":
        raise PolicyError(f"{where}: {tool} takes no pattern (OpenCode asks it as a whole); use *")
    return PermissionRule(tool, pattern, action)


def check_tool(tool: str, where: str) -> None:
    """A built-in permission name, `*`, or an MCP tool name (`server_tool`, globs allowed)."""
    if tool == "*" or tool in TOOLS:
        return
    if "_" in tool and _MCP_TOOL.match(tool) and tool not in ("question", "plan_enter"):
        return
    near = [name for name in TOOLS if name.startswith(tool[:2])] or list(TOOLS)
    raise PolicyError(
        f"{where}: unknown tool {tool!r}; use one of {', '.join(near)}, * for every tool, "
        "or an MCP tool as server_tool"
    )


def check_pattern(pattern: str, where: str) -> None:
    """A glob OpenCode can match: not empty, one line, printable, and not a regular expression."""
    if not pattern.strip():
        raise PolicyError(f"{where}: pattern is empty; use * for everything")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise PolicyError(f"{where}: pattern is over {MAX_PATTERN_LENGTH} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in pattern):
        raise PolicyError(f"{where}: pattern holds a control character (a newline?)")
    if pattern.startswith("^") or pattern.endswith("$") or any(h in pattern for h in _REGEX_HINTS):
        raise PolicyError(
            f"{where}: pattern {pattern!r} looks like a regular expression; patterns are globs: "
            "* matches anything, ? one character (e.g. 'git push *')"
        )
