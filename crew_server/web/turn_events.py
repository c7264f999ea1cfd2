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
_JSON = (str, int, float, bool, dict, list, type(None))
SHAPES: dict[str, dict[str, tuple[type, ...]]] = {
    "text": {"text": _TEXT},
    "reasoning": {"text": _TEXT},
    "tool_start": {"call_id": _TEXT, "tool": _TEXT, "title": (str, type(None)), "input": _JSON},
    "tool_use": {
        "tool": _TEXT,
        "title": (str, type(None)),
        "input": _JSON,
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


def call_id_of(event: Mapping[str, Any]) -> str | None:
    """The tool call a `tool_start` or `tool_use` event is about (None: not known)."""
    data = event.get("data")
    call_id = data.get("call_id") if isinstance(data, Mapping) else None
    return call_id if isinstance(call_id, str) else None


def folded_events(events: list[dict[str, Any]], running: bool) -> list[dict[str, Any]]:
    """The turn's events as its page lists them: each tool call once, where it began.

    A `tool_start` followed by the `tool_use` of its call is shown as that finished
    call in the start's place (the live page replaces it there too, `live.turn`), and
    the `tool_use` is not listed again. In a turn that is over, a start that never
    finished (a stop, a limit) is marked `unfinished` rather than left running.
    """
    shown: list[dict[str, Any]] = []
    open_calls: dict[str, int] = {}  # call id → its start's place in `shown`
    for event in events:
        call_id = call_id_of(event)
        if event.get("type") == "tool_use" and call_id in open_calls:
            shown[open_calls.pop(call_id)] = event
            continue
        if event.get("type") == "tool_start" and call_id is not None:
            open_calls[call_id] = len(shown)
        shown.append(event)
    if not running:
        for place in open_calls.values():
            shown[place] = {**shown[place], "unfinished": True}
    return shown


def open_starts(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The `tool_start` events among `events` whose call has no `tool_use` yet, by call id."""
    started: dict[str, dict[str, Any]] = {}
    for event in events:
        call_id = call_id_of(event)
        if call_id is None:
            continue
        if event.get("type") == "tool_start":
            started[call_id] = event
        elif event.get("type") == "tool_use":
            started.pop(call_id, None)
    return started
