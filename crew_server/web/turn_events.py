"""A stored turn event as the turn page can show it: each kind's fields checked, or "malformed".

The Computer sends events as any JSON object per kind (the API checks only
that); the page reads named fields of each kind (`_turn_event.html`). An event
that lacks one, or has one of another type, would fail the whole page, and the
turn's page with it for good: it is shown as malformed instead, with its data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The fields `_turn_event.html` reads, per kind, and the JSON types each may have.
_TEXT = (str,)
_NUMBER = (int, float)
SHAPES: dict[str, dict[str, tuple[type, ...]]] = {
    "text": {"text": _TEXT},
    "reasoning": {"text": _TEXT},
    "tool_use": {
        "tool": _TEXT,
        "title": (str, type(None)),
        "input": (str, int, float, bool, dict, list, type(None)),
        "output": (str, type(None)),
        "duration_ms": (int, float, type(None)),
        "failed": (bool,),
    },
    "step_finish": {"reason": _TEXT, "tokens": (dict,), "cost": (*_NUMBER, type(None))},
    "error": {"name": _TEXT, "message": _TEXT},
    "egress_denied": {
        "address": _TEXT,
        "port": (int,),
        "protocol": _TEXT,
        "name": (str, type(None)),
        "count": (int,),
    },
    # Approvals (issue 24).
    "approval_asked": {"tool": _TEXT, "summary": _TEXT},
    "approval_answered": {
        "state": _TEXT,
        "decision": (str, type(None)),
        "reason": (str, type(None)),
    },
    "permission_denied": {"tool": _TEXT, "summary": _TEXT, "reason": _TEXT},
}
TOKENS = ("input", "output", "cache_read")


def shape_problem(kind: str, data: object) -> str | None:
    """What keeps an event of `kind` with `data` from being shown as one; None when nothing."""
    if not isinstance(data, Mapping):
        return f"its data is {type(data).__name__}, not an object"
    for field, types in SHAPES.get(kind, {}).items():
        if field not in data:
            return f"it has no {field!r}"
        if not isinstance(data[field], types) or (
            isinstance(data[field], bool) and bool not in types
        ):
            return f"its {field!r} is {type(data[field]).__name__}"
    if kind == "step_finish":
        for count in TOKENS:
            value = data["tokens"].get(count)
            if not isinstance(value, _NUMBER) or isinstance(value, bool):
                return f"its tokens.{count} is {type(value).__name__}, not a number"
    return None


def shown_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """`event` as stored, or, when its data does not fit its kind, a `malformed` event
    (with `kind`, `problem` and the data) the page shows as such."""
    stored_problem = event.get("malformed")
    problem = stored_problem or shape_problem(str(event.get("type")), event.get("data"))
    if problem is None:
        return dict(event)
    return {**event, "type": "malformed", "kind": event.get("type"), "problem": problem}
