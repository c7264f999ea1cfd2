"""What the gateway counts of the calls that pass: per agent, and per request as it streams.

`UsageTap` reads a response's bytes as they are forwarded (a copy: it never
holds a chunk back) and finds the usage the provider reported: the
chat-completions usage chunk (OpenAI and compatible), `response.completed`
(OpenAI responses), `message_start` / `message_delta` (Anthropic),
`usageMetadata` (Google), or the `usage` of a non-streaming JSON body.
`AgentCounters` sums them per agent with the requests, refusals, 429s and
their `Retry-After`; a turn takes `counters.snapshot()` before and after and
reports the difference (`TrafficSnapshot.since`).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson

LINE_LIMIT = 1024 * 1024  # an SSE line longer than this is not parsed (still forwarded)
BODY_LIMIT = 4 * 1024 * 1024  # a JSON body longer than this is not parsed (still forwarded)


@dataclass
class RequestUsage:
    """Tokens of one model call, as its provider reported them."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def read_usage(event: Any, usage: RequestUsage) -> None:
    """Add what one JSON event (or body) says about usage to `usage`."""
    if not isinstance(event, dict):
        return
    kind = event.get("type")
    if kind == "message_start" and isinstance(event.get("message"), dict):
        _anthropic(event["message"].get("usage"), usage)
        return
    if kind == "message_delta":
        delta = event.get("usage")
        if isinstance(delta, dict):
            # Anthropic's output count in message_delta is the message's total so far.
            usage.output_tokens = max(usage.output_tokens, _int(delta.get("output_tokens")))
        return
    if kind == "response.completed" and isinstance(event.get("response"), dict):
        _responses(event["response"].get("usage"), usage)
        return
    found = event.get("usage")
    if isinstance(found, dict):
        if "prompt_tokens" in found:
            usage.input_tokens += _int(found.get("prompt_tokens"))
            usage.output_tokens += _int(found.get("completion_tokens"))
            details = found.get("prompt_tokens_details")
            if isinstance(details, dict):
                usage.cache_read += _int(details.get("cached_tokens"))
        elif "cache_read_input_tokens" in found or event.get("type") == "message":
            _anthropic(found, usage)
        else:
            _responses(found, usage)
    metadata = event.get("usageMetadata")
    if isinstance(metadata, dict):
        # Google's counts are the totals so far: the last one is the call's.
        usage.input_tokens = _int(metadata.get("promptTokenCount"))
        usage.output_tokens = _int(metadata.get("candidatesTokenCount"))
        usage.cache_read = _int(metadata.get("cachedContentTokenCount"))


def _anthropic(found: Any, usage: RequestUsage) -> None:
    if isinstance(found, dict):
        usage.input_tokens += _int(found.get("input_tokens"))
        usage.output_tokens = max(usage.output_tokens, _int(found.get("output_tokens")))
        usage.cache_read += _int(found.get("cache_read_input_tokens"))
        usage.cache_write += _int(found.get("cache_creation_input_tokens"))


def _responses(found: Any, usage: RequestUsage) -> None:
    if isinstance(found, dict):
        usage.input_tokens += _int(found.get("input_tokens"))
        usage.output_tokens += _int(found.get("output_tokens"))
        details = found.get("input_tokens_details")
        if isinstance(details, dict):
            usage.cache_read += _int(details.get("cached_tokens"))


class UsageTap:
    """Reads one response's usage from the bytes forwarded (module doc)."""

    def __init__(self, content_type: str) -> None:
        self.streaming = "text/event-stream" in content_type.lower()
        self.usage = RequestUsage()
        self._pending = b""
        self._body: bytearray | None = None if self.streaming else bytearray()

    def feed(self, chunk: bytes) -> None:
        if self._body is not None:
            if len(self._body) + len(chunk) <= BODY_LIMIT:
                self._body += chunk
            else:
                self._body = None
                self._pending = b""
            return
        if not self.streaming:
            return
        data = self._pending + chunk
        lines = data.split(b"\n")
        self._pending = lines.pop()
        if len(self._pending) > LINE_LIMIT:
            self._pending = b""
        for line in lines:
            self._line(line.rstrip(b"\r"))

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if not payload.startswith(b"{"):
            return  # `[DONE]`, keep-alives
        try:
            read_usage(orjson.loads(payload), self.usage)
        except orjson.JSONDecodeError:
            return

    def close(self) -> RequestUsage:
        """The call's usage, once its last byte was forwarded."""
        if self._body:
            with contextlib.suppress(orjson.JSONDecodeError):
                read_usage(orjson.loads(bytes(self._body)), self.usage)
            self._body = None
        elif self.streaming and self._pending:
            self._line(self._pending.rstrip(b"\r"))
            self._pending = b""
        return self.usage


@dataclass(frozen=True)
class TrafficSnapshot:
    """One agent's gateway totals at a moment (what a turn subtracts)."""

    requests: int = 0
    refused: int = 0
    rate_limited: int = 0
    upstream_errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    retry_after_s: float | None = None  # the last 429's wait, when it said one

    def since(self, before: TrafficSnapshot) -> dict[str, Any]:
        """What happened between `before` and this snapshot: the turn's gateway usage."""
        now, then = asdict(self), asdict(before)
        out: dict[str, Any] = {
            k: now[k] - then[k] for k in now if k != "retry_after_s" and now[k] is not None
        }
        out["retry_after_s"] = self.retry_after_s if out["rate_limited"] else None
        return out


class AgentCounters:
    """One agent's gateway totals since the Computer started."""

    def __init__(self) -> None:
        self._now = TrafficSnapshot()

    def snapshot(self) -> TrafficSnapshot:
        return self._now

    def add(self, **changes: int) -> None:
        now = asdict(self._now)
        self._now = replace(self._now, **{k: now[k] + v for k, v in changes.items()})

    def rate_limited(self, retry_after_s: float | None) -> None:
        self._now = replace(
            self._now, rate_limited=self._now.rate_limited + 1, retry_after_s=retry_after_s
        )

    def used(self, usage: RequestUsage) -> None:
        self.add(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read=usage.cache_read,
            cache_write=usage.cache_write,
        )
