"""A warm server's SSE events → the JSON lines `opencode run --format json` prints. Pure.

`opencode run` is itself a client of the server's API: it prints a line for
some of the `/event` stream's events of its session (read from its source;
docs/warm-engine.md). `run_line` applies exactly its rules, so the existing
line parser (`engine.events.engine_event_of`), the failure classes and the
records upstream are the same for both engines:

| SSE event | condition | line |
| --- | --- | --- |
| `message.part.updated` | tool part, `state.status` completed or error | `tool_use` |
| `message.part.updated` | tool part first seen `running` (`ToolStarts`) | `tool_start` |
| `message.part.updated` | `step-start` part | `step_start` |
| `message.part.updated` | `step-finish` part | `step_finish` |
| `message.part.updated` | text part with `time.end` | `text` |
| `session.error` | with an `error` | `error` |

(`reasoning` lines need `run --thinking`, which cold turns do not pass.)
`tool_start` is the one line `opencode run` never prints (it skips running states):
only a warm turn shows a tool while it runs (docs/warm-engine.md).
`TurnEnd` decides when the turn is over (a `permission.asked` is the
approvals' business: `approvals.asked_of`). Everything read from the server is untrusted:
anything of an unexpected shape is ignored, never an exception.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

import orjson

_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# One SSE event over this is not an OpenCode event (the biggest seen: ~100 KB of tool output).
MAX_EVENT_BYTES = 16 * 1024 * 1024


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _line(kind: str, session_id: str, now_ms: int, **rest: Any) -> dict[str, Any]:
    return {"type": kind, "timestamp": now_ms, "sessionID": session_id, **rest}


def run_line(event: Any, session_id: str, now_ms: int) -> dict[str, Any] | None:
    """The line `opencode run` prints for `event` of session `session_id`, or None."""
    event = _dict(event)
    kind = event.get("type")
    props = _dict(event.get("properties"))
    if kind == "message.part.updated":
        part = _dict(props.get("part"))
        if part.get("sessionID") != session_id:
            return None
        part_type = part.get("type")
        if part_type == "tool":
            if _dict(part.get("state")).get("status") in ("completed", "error"):
                return _line("tool_use", session_id, now_ms, part=part)
        elif part_type == "step-start":
            return _line("step_start", session_id, now_ms, part=part)
        elif part_type == "step-finish":
            return _line("step_finish", session_id, now_ms, part=part)
        elif part_type == "text" and _dict(part.get("time")).get("end"):
            return _line("text", session_id, now_ms, part=part)
        return None
    if kind == "session.error":
        if props.get("sessionID") != session_id or not props.get("error"):
            return None
        return _line("error", session_id, now_ms, error=props["error"])
    return None


class ToolStarts:
    """The `tool_start` line of each tool call of a session, once, when it starts running.

    OpenCode updates a tool part several times before it finishes: `pending` (no
    input yet), `running`, then `running` again with `state.metadata` (a bash
    call's output so far). The first `running` update says the call began with
    its input; the later ones add nothing a person waits for, so they give no line.
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def line(self, event: Any, session_id: str, now_ms: int) -> dict[str, Any] | None:
        """The `tool_start` line for `event` when it is a call's first running update."""
        event = _dict(event)
        part = _dict(_dict(event.get("properties")).get("part"))
        state = _dict(part.get("state"))
        call_id = part.get("callID")
        if (
            event.get("type") != "message.part.updated"
            or part.get("sessionID") != session_id
            or part.get("type") != "tool"
            or state.get("status") != "running"
            or not isinstance(call_id, str)
            or call_id in self._seen
        ):
            return None
        self._seen.add(call_id)
        started = _dict(state.get("time")).get("start")
        if isinstance(started, bool) or not isinstance(started, int):
            started = now_ms
        return _line("tool_start", session_id, started, part=part)


def session_of(event: Any) -> str | None:
    """The session an event is about (`properties.sessionID`, or its `info`'s or `part`'s)."""
    props = _dict(_dict(event).get("properties"))
    for holder in (props, _dict(props.get("info")), _dict(props.get("part"))):
        found = holder.get("sessionID")
        if isinstance(found, str):
            return found
    return None


def retry_status(event: Any, session_id: str) -> tuple[float, str] | None:
    """`(next, message)` of a `session.status` of type `retry` of the session: OpenCode waits
    until `next` (epoch ms) before it asks the model again (a rate limit's Retry-After)."""
    event = _dict(event)
    props = _dict(event.get("properties"))
    status = _dict(props.get("status"))
    if (
        event.get("type") != "session.status"
        or props.get("sessionID") != session_id
        or status.get("type") != "retry"
    ):
        return None
    at = status.get("next")
    if isinstance(at, bool) or not isinstance(at, int | float):
        return None
    message = status.get("message")
    return float(at), message[:300] if isinstance(message, str) else ""


class TurnEnd:
    """When a turn sent with our own `message_id` is over (docs/warm-engine.md).

    Over at the first `session.status` idle after an assistant message whose
    parent is our message was finalised (`time.completed` or `error`): error
    and abort turns go idle twice, and a prompt sent between the two idles is
    dropped. A turn that fails before any assistant message exists (an
    unknown model) only says `session.error` and idle: `error_idle` tells the
    caller to give it a short grace for a finalised message, then end it.
    """

    def __init__(self, session_id: str, message_id: str) -> None:
        self.session_id = session_id
        self.message_id = message_id
        self.finalised = False
        self.errored = False
        self.error_idle = False
        self.over = False

    def see(self, event: Any) -> bool:
        """Take one event into account; True once the turn is over."""
        event = _dict(event)
        kind = event.get("type")
        props = _dict(event.get("properties"))
        if kind == "message.updated":
            info = _dict(props.get("info"))
            if (
                info.get("sessionID") == self.session_id
                and info.get("role") == "assistant"
                and info.get("parentID") == self.message_id
                and (_dict(info.get("time")).get("completed") or info.get("error"))
            ):
                self.finalised = True
        elif kind == "session.error" and props.get("sessionID") == self.session_id:
            self.errored = True
        elif (
            kind == "session.status"
            and props.get("sessionID") == self.session_id
            and _dict(props.get("status")).get("type") == "idle"
        ):
            if self.finalised:
                self.over = True
            elif self.errored:
                self.error_idle = True
        return self.over


class MessageIds:
    """OpenCode's ascending message ids: `msg_` + 12 hex of (ms·4096 + counter) + 14 base62."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0
        self._counter = 0

    def next(self) -> str:
        """A new id, sorting after every id made before it (ours and the server's so far)."""
        with self._lock:
            now = int(time.time() * 1000)
            if now != self._last_ms:
                self._last_ms, self._counter = now, 0
            self._counter += 1
            value = (now * 4096 + self._counter) % (1 << 48)
        tail = "".join(_BASE62[b % 62] for b in secrets.token_bytes(14))
        return f"msg_{value:012x}{tail}"


class SseFrames:
    """Splits an SSE byte stream into the JSON objects of its `data:` lines. Bounded."""

    def __init__(self, limit: int = MAX_EVENT_BYTES) -> None:
        self._buffer = bytearray()
        self._data: list[bytes] = []
        self._size = 0
        self._limit = limit

    def feed(self, chunk: bytes) -> list[Any]:
        """The events completed by `chunk`; raises `ValueError` for an event over the limit."""
        self._buffer += chunk
        events: list[Any] = []
        while (end := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:end]).rstrip(b"\r")
            del self._buffer[: end + 1]
            if not line:
                if self._data:
                    events.append(_json(b"\n".join(self._data)))
                self._data, self._size = [], 0
            elif line.startswith(b"data:"):
                value = line[5:].removeprefix(b" ")
                self._size += len(value)
                if self._size > self._limit:
                    raise ValueError(f"an event of the server is over {self._limit} bytes")
                self._data.append(value)
        if len(self._buffer) > self._limit:
            raise ValueError(f"a line of the server's event stream is over {self._limit} bytes")
        return [e for e in events if e is not None]


def _json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def server_password() -> str:
    """A fresh per-server password (only this server's sandbox and the Computer know it)."""
    return secrets.token_urlsafe(32)
