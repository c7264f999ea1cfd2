"""The line under a room's timeline (issue 25): who is working on a turn for the room
now, and one short line per agent whose turns there failed, however often it retried.

The store says what is so (`Store.room_activity`); this says it in a few words: the
failure class in plain words and the first sentence of the reason. The whole reason
stays on the agent's page, where the "how to fix" link goes.
"""

from __future__ import annotations

import re
from typing import Any

from crew_server.web.access import Web

# A failure class (`computer_service.engine.base.FailureClass`) in plain words.
FAILURE_WORDS = {
    "not_logged_in": "not logged in",
    "model_unavailable": "the model is unavailable",
    "rate_limited": "rate limited",
    "session_invalid": "its session was lost",
    "sandbox": "the sandbox failed",
    "engine_error": "the engine failed",
    "process_crashed": "the engine crashed",
    "output_too_large": "its output was too large",
    "resource_limit": "it hit a resource limit",
    "reply_refused": "its reply was refused",
    "stopped": "it was stopped",
}
REASON_CHARS = 160
# A sentence ends at a stop followed by space and what starts the next one.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\"'])")


def first_sentence(reason: str) -> str:
    """The reason's first sentence, without its stop, at most `REASON_CHARS`."""
    sentence = _SENTENCE_END.split(reason.strip(), maxsplit=1)[0].rstrip(".")
    if len(sentence) > REASON_CHARS:
        sentence = sentence[: REASON_CHARS - 1].rstrip() + "…"
    return sentence


def short_reason(failure_class: str, reason: str) -> str:
    """`not logged in: the model provider refused the credentials (HTTP 401: …)`: the
    class in words, then the reason's first sentence (once, when it says the same)."""
    words = FAILURE_WORDS.get(failure_class, failure_class.replace("_", " "))
    sentence = first_sentence(reason)
    if not sentence:
        return words
    if sentence.lower().startswith(words.lower()):
        return sentence
    return f"{words}: {sentence}"


def room_status(web: Web, room_id: str) -> dict[str, list[dict[str, Any]]]:
    """What `_room_status.html` shows for a room: `working` and `failures` (each failure
    with its `short` reason)."""
    activity = web.store.room_activity(room_id)
    failures = [{**f, "short": short_reason(f["class"], f["reason"])} for f in activity["failures"]]
    return {"working": activity["working"], "failures": failures}
