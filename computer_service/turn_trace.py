"""Where a turn's time went (issue 26): the steps of its critical path, in wall-clock time.

A runner keeps one `TurnTrace` per turn and marks each step when it happens; the engine
marks its own (`server_ready`, `prompt_sent`, `engine_accepted`) through `TurnRequest.mark`. The finish
carries the marks to the server (epoch milliseconds, the wall clock: the server adds its
own steps, `reply_received` and `reply_stored`, by its clock — on one machine the same;
across machines, as far apart as their clocks).

Steps, in their order on the path of a reply:

- `post`: the newest claimed message's time on the server (its `created_at`);
- `wake`: the first wake-up for this turn reached the runner (none: the runner woke by
  itself, a retry or the rest of a cut claim);
- `claimed`, `registered`: the answers to the claim and the registration arrived;
- `server_ready`: the warm way got the agent's server (warm only);
- `prompt_sent`: the warm way sends the prompt to the server (warm only: OpenCode's own
  work on the turn begins here);
- `engine_accepted`: the engine took the prompt (warm: `prompt_async` answered; cold:
  the launcher said the process started, where OpenCode's own work begins);
- `first_token`: the first text, reasoning or tool event of the model;
- `acked`: the ack's answer arrived (after the turn; not on the reply's path).
"""

from __future__ import annotations

import time
from datetime import datetime

STEPS = (
    "post",
    "wake",
    "claimed",
    "registered",
    "server_ready",
    "prompt_sent",
    "engine_accepted",
    "first_token",
    "acked",
)
# The events that mean the model has started to answer.
FIRST_TOKEN_EVENTS = frozenset({"text", "reasoning", "tool_use", "tool_start"})


def now_ms() -> int:
    """The wall clock in epoch milliseconds."""
    return int(time.time() * 1000)


def epoch_ms_of(text: object) -> int | None:
    """An RFC 3339 time of the server (a message's `created_at`) in epoch ms; None when it is
    not one."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return int(moment.timestamp() * 1000)


class TurnTrace:
    """The marks of one turn; the first mark of a step counts, later ones are ignored."""

    def __init__(self) -> None:
        self._marks: dict[str, int] = {}

    def mark(self, step: str, at_ms: int | None = None) -> None:
        """`step` happened now (or at `at_ms`). Unknown steps are a caller's bug: ignored."""
        if step in STEPS and step not in self._marks:
            self._marks[step] = now_ms() if at_ms is None else at_ms

    def saw_event(self, event_type: str) -> None:
        """An engine event: the first of the model's marks `first_token`."""
        if event_type in FIRST_TOKEN_EVENTS:
            self.mark("first_token")

    def as_upstream(self) -> dict[str, int]:
        """The marks as the finish sends them, in step order."""
        return {step: self._marks[step] for step in STEPS if step in self._marks}
