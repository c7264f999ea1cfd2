"""`permission_denied` turn events for the calls a `deny` rule refused, in both engines. Pure.

OpenCode refuses a call a `deny` rule matches before it runs: the tool part
ends in error with its `DeniedError` text (`DENIED_TEXT`, OpenCode 1.18.33's
exact words) and the agent goes on (docs/warm-engine.md "Permissions").
`denial_of` turns such a `tool_use` into a `permission_denied` event with the
reason: an `ask` of the policy the cold engine had to make a `deny`
(`approvals.COLD_REASON`), else the policy's `deny` rule. Which rule decided
is worked out as OpenCode does (`wildcard`: its glob; the last rule that
matches wins) from what the call asked (the command, the path).
"""

from __future__ import annotations

import re
from typing import Any

from computer_service.engine.approvals import COLD_REASON, SUMMARY_LIMIT
from computer_service.engine.base import EngineEvent
from crew_common.permissions import PermissionPolicy

DENIED_TEXT = "The user has specified a rule which prevents you from using this specific tool call"
# A person's "Deny" with the reason (OpenCode's CorrectedError), and a bare reject.
REJECTED_TEXT = "The user rejected permission to use this specific tool call"
DENY_REASON = "a deny rule of the agent's permission policy"
# The tools OpenCode asks as `edit` (its source: write, patch and multiedit ask `edit`).
EDIT_TOOLS = ("edit", "write", "patch", "multiedit", "apply_patch")


def wildcard(pattern: str, subject: str) -> bool:
    """OpenCode's `Wildcard.match`: `*` anything, `?` one character, the rest literal; a
    trailing ` *` also matches without it (`git push *` matches `git push`)."""
    optional_tail = pattern.endswith(" *")
    body = pattern[:-2] if optional_tail else pattern
    regex = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in body)
    if optional_tail:
        regex += "( .*)?"
    return re.fullmatch(regex, subject, re.DOTALL) is not None


def decides(policy: PermissionPolicy, permission: str, subject: str, *, can_ask: bool) -> str:
    """The action the policy gives `permission` on `subject` (the last matching rule's)."""
    action = "ask"  # OpenCode's default when no rule matches
    for rule in policy.effective():
        if wildcard(rule.tool, permission) and wildcard(rule.pattern, subject):
            action = rule.action
    return "deny" if action == "ask" and not can_ask else action


def call_subject(data: dict[str, Any]) -> tuple[str, str]:
    """(permission, subject) of a `tool_use` event's call: what OpenCode matches rules on."""
    tool = str(data.get("tool") or "unknown")
    tool_input = data.get("input")
    tool_input = tool_input if isinstance(tool_input, dict) else {}
    permission = "edit" if tool in EDIT_TOOLS else tool
    for key in ("command", "filePath", "path", "url", "pattern", "query"):
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            return permission, value
    return permission, "*"


def denial_of(event: EngineEvent, policy: PermissionPolicy) -> EngineEvent | None:
    """The `permission_denied` event of a `tool_use` a `deny` rule refused, or None."""
    if event.type != "tool_use" or not event.data.get("failed"):
        return None
    if DENIED_TEXT not in str(event.data.get("output", "")):
        return None
    permission, subject = call_subject(event.data)
    reason = DENY_REASON
    if _would_ask(policy, permission, subject):
        reason = COLD_REASON
    return EngineEvent(
        type="permission_denied",
        at=event.at,
        data={"tool": permission, "summary": subject[:SUMMARY_LIMIT], "reason": reason},
        session_id=event.session_id,
    )


def _would_ask(policy: PermissionPolicy, permission: str, subject: str) -> bool:
    """Whether an engine that can ask would have asked: the command's own parts too (OpenCode
    asks a bash line per command in it: `cd x && git push` asks `git push`)."""
    subjects = [subject]
    if permission == "bash":
        subjects += [p.strip() for p in re.split(r"&&|\|\||[;|\n]", subject) if p.strip()]
    return any(decides(policy, permission, s, can_ask=True) == "ask" for s in subjects)
