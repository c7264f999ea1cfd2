"""OpenCode's `--format json` stdout lines → run-record events (computer.md §3).

One pure function, `engine_event_of(line)`. Every line gives exactly one
event: known types map to the upstream shapes (upstream.md "event"), unknown
types become `other` with their type name, and a line that is not JSON, not
UTF-8 or not an object becomes `other` with `type: "unparsed"` and the
(cut, repaired) text, so nothing is dropped silently and nothing is fatal.

Texts, tool outputs and titles are cut to 4,096 characters on a code-point
boundary. Tool input stays an object with every string in it cut the same way;
an input whose JSON is still over 16 KiB becomes `{"_cut": <its JSON, cut>}`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import orjson

from computer_service.engine.base import EngineEvent

TEXT_LIMIT = 4096
INPUT_JSON_LIMIT = 16 * 1024


def cut_text(text: str, limit: int = TEXT_LIMIT) -> str:
    """The first `limit` code points of `text`, never ending in half a surrogate pair.

    Python strings from valid UTF-8 never hold surrogates; this also repairs
    any lone surrogate so the result always encodes as UTF-8.
    """
    if len(text) > limit:
        text = text[:limit]
        if "\ud800" <= text[-1] <= "\udbff":
            text = text[:-1]
    return text.encode("utf-8", "replace").decode("utf-8") if _has_surrogate(text) else text


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _cut_strings(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return cut_text(value)
    if depth > 32:
        return cut_text(orjson.dumps(value).decode())
    if isinstance(value, dict):
        return {cut_text(str(k), 256): _cut_strings(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut_strings(v, depth + 1) for v in value]
    return value


def _tool_input(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        return {} if raw is None else {"_value": _cut_strings(raw)}
    cut = _cut_strings(raw)
    encoded = orjson.dumps(cut)
    if len(encoded) > INPUT_JSON_LIMIT:
        return {"_cut": cut_text(encoded.decode())}
    return dict(cut)


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return cut_text(value)
    return cut_text(orjson.dumps(value, default=str).decode())


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _number(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return 0.0


def _at(timestamp: Any, now: datetime | None) -> str:
    if isinstance(timestamp, int | float) and not isinstance(timestamp, bool):
        try:
            return datetime.fromtimestamp(timestamp / 1000, UTC).isoformat(timespec="milliseconds")
        except (OverflowError, OSError, ValueError):
            pass
    return (now or datetime.now(UTC)).isoformat(timespec="milliseconds")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _unparsed(kind: str, text: str, now: datetime | None) -> EngineEvent:
    return EngineEvent(
        type="other",
        at=_at(None, now),
        data={"type": "unparsed", "problem": kind, "text": cut_text(text)},
    )


def engine_event_of(line: bytes | str, now: datetime | None = None) -> EngineEvent:
    """Turn one stdout line of `opencode run --format json` into an `EngineEvent`.

    Never raises. `now` stamps events whose line has no usable timestamp
    (default: the current time).
    """
    raw = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else bytes(line)
    raw = raw.rstrip(b"\r\n")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            text = raw.decode("utf-8")
            problem = "not JSON"
        except UnicodeDecodeError:
            text = raw.decode("utf-8", "replace")
            problem = "not UTF-8"
        return _unparsed(problem, text, now)
    if not isinstance(obj, dict):
        return _unparsed("not a JSON object", raw.decode("utf-8", "replace"), now)
    return _event_of_object(obj, now)


def _event_of_object(obj: dict[str, Any], now: datetime | None) -> EngineEvent:
    kind = obj.get("type")
    part = _dict(obj.get("part"))
    session_id = obj.get("sessionID") or part.get("sessionID")
    session_id = session_id if isinstance(session_id, str) and session_id else None
    at = _at(obj.get("timestamp"), now)
    facts: dict[str, Any] | None = None

    if kind == "step_start":
        data: dict[str, Any] = {}
    elif kind in ("text", "reasoning"):
        data = {"text": _as_text(part.get("text"))}
    elif kind == "tool_start":
        data = _tool_start(part)
    elif kind == "tool_use":
        data = _tool_use(part)
        # The exit status of a bash call (`state.metadata.exit`) tells whether `crew reply` got through.
        exit_code = _dict(_dict(part.get("state")).get("metadata")).get("exit")
        if isinstance(exit_code, int) and not isinstance(exit_code, bool):
            facts = {"exit": exit_code}
    elif kind == "step_finish":
        tokens = _dict(part.get("tokens"))
        cache = _dict(tokens.get("cache"))
        reason = part.get("reason")
        data = {
            "reason": cut_text(reason, 64) if isinstance(reason, str) else "unknown",
            "tokens": {
                "input": _int(tokens.get("input")),
                "output": _int(tokens.get("output")),
                "reasoning": _int(tokens.get("reasoning")),
                "cache_read": _int(cache.get("read")),
                "cache_write": _int(cache.get("write")),
            },
            "cost": _number(part.get("cost")),
        }
    elif kind == "error":
        error = _dict(obj.get("error"))
        err_data = _dict(error.get("data"))
        name = error.get("name")
        data = {
            "name": cut_text(name, 256) if isinstance(name, str) else "Error",
            "message": _as_text(err_data.get("message") or error.get("message")),
        }
        facts = {}
        status = err_data.get("statusCode")
        if isinstance(status, int) and not isinstance(status, bool):
            facts["status_code"] = status
        if isinstance(err_data.get("isRetryable"), bool):
            facts["retryable"] = err_data["isRetryable"]
    else:
        name = kind if isinstance(kind, str) and kind else "missing"
        data = {"type": cut_text(name, 256)}
        kind = "other"

    return EngineEvent(type=str(kind), at=at, data=data, session_id=session_id, facts=facts)


def _call_id(part: dict[str, Any]) -> str | None:
    call_id = part.get("callID")
    return cut_text(call_id, 256) if isinstance(call_id, str) else None


def _tool_start(part: dict[str, Any]) -> dict[str, Any]:
    """A tool call that began (warm turns only: `warm_events.ToolStarts`); its `tool_use`
    has the same `call_id`."""
    state = _dict(part.get("state"))
    tool = part.get("tool")
    title = state.get("title")
    return {
        "call_id": _call_id(part),
        "tool": cut_text(tool, 256) if isinstance(tool, str) else "unknown",
        "title": cut_text(title) if isinstance(title, str) else None,
        "input": _tool_input(state.get("input")),
    }


def _tool_use(part: dict[str, Any]) -> dict[str, Any]:
    state = _dict(part.get("state"))
    time = _dict(state.get("time"))
    start, end = time.get("start"), time.get("end")
    duration = (
        int(end - start)
        if isinstance(start, int | float)
        and isinstance(end, int | float)
        and not isinstance(start, bool)
        and not isinstance(end, bool)
        else None
    )
    failed = state.get("status") == "error"
    output = state.get("error") if failed else state.get("output")
    tool = part.get("tool")
    title = state.get("title")
    data = {
        "tool": cut_text(tool, 256) if isinstance(tool, str) else "unknown",
        "title": cut_text(title) if isinstance(title, str) else None,
        "input": _tool_input(state.get("input")),
        "output": _as_text(output),
        "duration_ms": duration,
        "failed": failed,
    }
    if (call_id := _call_id(part)) is not None:
        data["call_id"] = call_id  # the same as its `tool_start`'s (warm turns)
    return data


UNVERIFIED_LIMIT = 10  # findings recorded per turn; a flood adds nothing after that


class OutputCheck:
    """Flags engine lines OpenCode would not have written (issue 12, "forged events"). Pure.

    The engine's stdout is a socket its tools cannot open through `/proc`
    (sandbox_launcher/engine_run.py), but a tool could still reach into the
    engine (ptrace, `/proc/<pid>/mem`; the sandbox is the engine's too). What
    such a forgery most easily gets wrong is caught here: a line that does not
    parse, a `step_finish` with no step open (a second end of a step or of the
    run), an event of another session. A flagged `step_finish` counts for no
    usage, and each finding goes into the record as an `other` event of type
    `unverified_output`, so the record says which facts are not OpenCode's.
    """

    def __init__(self) -> None:
        self.session_id: str | None = None
        self.step_open = False
        self.findings = 0

    def see(self, event: EngineEvent) -> str | None:
        """Take one event; the finding when it does not fit OpenCode's output, else None."""
        finding = self._finding(event)
        if finding is not None:
            self.findings += 1
        return finding

    def _finding(self, event: EngineEvent) -> str | None:
        if event.session_id is not None:
            if self.session_id is None:
                self.session_id = event.session_id
            elif event.session_id != self.session_id:
                return f"a {event.type} event of another session"
        if event.type == "other" and event.data.get("type") == "unparsed":
            return "a line that is not an OpenCode event"
        if event.type == "step_start":
            self.step_open = True
        elif event.type == "step_finish":
            if not self.step_open:
                return "a step_finish with no step open (a second end)"
            self.step_open = False
        return None

    def record(self, finding: str, now: datetime | None = None) -> EngineEvent | None:
        """The `unverified_output` event for the record (None past `UNVERIFIED_LIMIT`)."""
        if self.findings > UNVERIFIED_LIMIT:
            return None
        at = (now or datetime.now(UTC)).isoformat(timespec="milliseconds")
        return EngineEvent(
            type="other",
            at=at,
            data={
                "type": "unverified_output",
                "finding": finding,
                "note": "the engine's output held a line OpenCode would not write; this "
                "turn's events and usage are not verified (a flagged step_finish is not counted)",
            },
        )


_LOG_FIELD = re.compile(r'([\w.]+)=("(?:[^"\\]|\\.)*"|\S*)')


def log_fields(line: str) -> dict[str, str]:
    """The `key=value` fields of one OpenCode log line (quoted values unquoted)."""
    fields = {}
    for key, value in _LOG_FIELD.findall(line):
        if value.startswith('"') and value.endswith('"') and len(value) >= 2:
            value = value[1:-1].replace('\\"', '"')
        fields[key] = value
    return fields


class ModelRequests:
    """Whether OpenCode is waiting to ask the model again, from its log lines (cold runs).

    A cold `opencode run` prints nothing on stdout while it waits out a retry;
    its log says a request of the turn's agent failed (`stream error`,
    `small=false`; the title request's own retries do not count) and, when it
    tries again, that a request starts (`stream`). A stdout line is progress too.
    """

    def __init__(self) -> None:
        self.failed_at: float | None = None  # when the last request failed, none started since
        self.error = ""

    def see_log(self, line: str, now: float) -> None:
        """Take one log line (a launcher `log` frame) into account."""
        fields = log_fields(line)
        if fields.get("small") != "false":
            return
        if fields.get("message") == "stream error":
            self.failed_at = now
            self.error = fields.get("error.error", "")[:300]
        elif fields.get("message") == "stream":
            self.failed_at = None

    def progressed(self) -> None:
        """OpenCode printed a line: whatever it was waiting for is over."""
        self.failed_at = None

    def waiting_for(self, now: float) -> float:
        """How long OpenCode has been waiting to retry a failed request (0: it is not)."""
        return 0.0 if self.failed_at is None else now - self.failed_at
