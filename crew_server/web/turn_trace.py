"""A turn's trace as the turn page shows it: "where the time went" (issue 26). Pure."""

from __future__ import annotations

from typing import Any

# Every step a trace may hold, in its order on the path of a reply, with what it means.
STEPS: tuple[tuple[str, str], ...] = (
    ("post", "message posted"),
    ("wake", "wake-up reached the Computer"),
    ("claimed", "messages claimed"),
    ("registered", "turn registered"),
    ("server_ready", "warm server ready"),
    ("prompt_sent", "prompt sent to the engine"),
    ("engine_accepted", "engine took the prompt"),
    ("first_token", "first model output"),
    ("reply_received", "reply reached the server"),
    ("reply_stored", "reply stored"),
    ("acked", "messages marked read"),
)


def trace_rows(trace: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One row per step the turn reached, in path order: its label, milliseconds since the
    first step (the post when known) and since the step before. Empty: no trace."""
    if not trace:
        return []
    reached = [(key, label, trace[key]) for key, label in STEPS if isinstance(trace.get(key), int)]
    if not reached:
        return []
    origin = reached[0][2]
    rows = []
    previous = origin
    for key, label, at in reached:
        rows.append({"step": key, "label": label, "since": at - origin, "delta": at - previous})
        previous = at
    return rows
