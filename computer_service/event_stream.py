"""`EventStream`: follows the crew server's `GET /computer/events` (computer.md §1 step 6).

After every (re)connect the roster syncs and every runner is woken: events
missed while away may have brought messages. Reconnects wait with capped
exponential backoff and jitter (`Backoff`), from the server's `retry:`, and
send `Last-Event-ID` so missed events replay. A refused token ends the run:
retrying cannot fix it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anyio
import httpx
import orjson
from httpx_sse import ServerSentEvent, SSEError

from computer_service.roster import Roster
from computer_service.upstream import (
    Superseded,
    Unauthorized,
    Upstream,
    UpstreamError,
    UpstreamRejected,
    UpstreamUnavailable,
)

log = logging.getLogger(__name__)

# The one line a replaced Computer exits with.
SUPERSEDED = (
    "another Computer connected to the crew server with this Computer's token (was the app "
    "started twice?); this one stops without acknowledging anything. Only one Computer may "
    "use a token"
)

BACKOFF_INITIAL_S = 0.5
# While the server cannot be reached at all, try again this often (see `follow`).
UNREACHABLE_RETRY_S = 1.0
BACKOFF_CAP_S = 30.0


class Backoff:
    """Capped exponential backoff with jitter; the server's `retry:` sets the base."""

    def __init__(self, initial_s: float = BACKOFF_INITIAL_S, cap_s: float = BACKOFF_CAP_S):
        self.base_s = initial_s
        self.cap_s = cap_s
        self.attempt = 0

    def reset(self) -> None:
        """After a successful connect: start again from the base delay."""
        self.attempt = 0

    def server_retry(self, retry_ms: int) -> None:
        """Take the server's `retry:` (milliseconds) as the base delay."""
        self.base_s = min(max(retry_ms / 1000, 0.05), self.cap_s)

    def next_delay(self) -> float:
        """The next delay in seconds, doubled each time up to the cap, jittered."""
        delay = min(self.cap_s, self.base_s * 2**self.attempt)
        self.attempt = min(self.attempt + 1, 30)
        # Full jitter on the upper half: many Computers do not reconnect in lockstep.
        return delay * random.uniform(0.5, 1.0)


class EventStream:
    """The Computer's subscription to its server's events, reconnecting until cancelled."""

    def __init__(self, upstream: Upstream, roster: Roster, *, fail: Callable[[str], None]) -> None:
        self.upstream = upstream
        self.roster = roster
        # Called with the reason when following cannot go on (the run then exits 1).
        self._fail = fail
        self.connected = False
        # When the open stream opened (RFC 3339, for `GET /health`); None while closed.
        self.connected_since: str | None = None
        self.last_event_id: str | None = None
        self.backoff = Backoff()

    async def follow(self) -> None:
        """Follow the stream until cancelled or refused for good (see module doc)."""
        backoff = self.backoff
        while True:
            opened = False
            unreachable = False
            try:
                async with self.upstream.events(self.last_event_id) as source:
                    opened = True
                    self.connected = True
                    self.connected_since = datetime.now(UTC).isoformat(timespec="seconds")
                    await self.roster.sync_agents()
                    self.roster.wake_all()
                    delivered = False
                    async for event in source.aiter_sse():
                        if not delivered:
                            # Back to the base delay only once the stream works: one that
                            # a proxy closes right after the 200 still backs off.
                            backoff.reset()
                            delivered = True
                        if event.retry is not None:
                            backoff.server_retry(event.retry)
                        await self._on_event(event)
                        if event.id:
                            self.last_event_id = event.id
                log.warning("the event stream ended; reconnecting")
            except Unauthorized as exc:
                self._fail(f"the event stream stopped: {exc}")
                return
            except Superseded:
                self._fail(SUPERSEDED)
                return
            except UpstreamRejected as exc:
                if opened:
                    log.warning("event stream: %s; reconnecting", exc)
                elif self.last_event_id is not None:
                    # Perhaps an id the server no longer takes: start afresh (the wake-all
                    # after connecting covers what the replay would have brought).
                    log.warning("event stream refused: %s; reconnecting without an id", exc)
                    self.last_event_id = None
                else:
                    self._fail(f"cannot subscribe to the crew server's events: {exc}")
                    return
            except (UpstreamError, httpx.HTTPError, SSEError) as exc:
                log.warning("event stream: %s; reconnecting", exc)
                unreachable = _unreachable(exc)
            finally:
                self.connected = False
                self.connected_since = None
            delay = backoff.next_delay()
            if unreachable:
                # Knocking on a server that is down costs nothing: be back within a
                # second of it answering again, not after the whole backoff.
                delay = min(delay, UNREACHABLE_RETRY_S)
            await anyio.sleep(delay)

    async def _on_event(self, event: ServerSentEvent) -> None:
        if event.event == "superseded":
            raise Superseded("a newer connection with this Computer's token", status=409)
        if event.event == "revoked":
            # The Computer was deleted on the server: its token works no more.
            raise Unauthorized(str(_field(event.data, "reason") or "the token was revoked"))
        if event.event == "wake":
            data = event_data(event.data)
            if data is None:
                log.warning("ignored a malformed wake event: %.200r", event.data)
                return
            # `now`: a person's Wake, past any retry backoff (issue 25).
            await self.roster.wake_from_server(data["agent_id"], now=data.get("now") is True)
        elif event.event == "stop":
            data = event_data(event.data)
            if data is None or not isinstance(data.get("turn_id"), str):
                log.warning("ignored a malformed stop event: %.200r", event.data)
                return
            self.roster.stop_from_server(data["agent_id"], data["turn_id"])
        elif event.event == "prewarm":
            # A person opened or typed in a room of these agents: warm them (issue 26).
            ids = _field(event.data, "agent_ids")
            if not isinstance(ids, list) or not all(isinstance(a, str) for a in ids):
                log.warning("ignored a malformed prewarm event: %.200r", event.data)
                return
            self.roster.prewarm_from_server(ids[:1000])
        elif event.event == "agents":
            await self.roster.agents_changed()
        elif event.event not in ("ping", "message"):
            log.info("ignored an unknown event %.50r", event.event)


def _unreachable(exc: BaseException) -> bool:
    """Whether the server could not be reached at all (no answer), as opposed to refusing."""
    if isinstance(exc, UpstreamUnavailable):
        return exc.status is None
    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))


def event_data(data: str) -> dict[str, Any] | None:
    """An agent event's data (`wake`, `stop`): a JSON object with a string `agent_id`,
    or None when the data is malformed."""
    try:
        parsed: Any = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if isinstance(parsed, dict) and isinstance(parsed.get("agent_id"), str):
        return parsed
    return None


def _field(data: str, name: str) -> Any:
    """One field of an event's JSON object data (None when the data is not one)."""
    try:
        parsed: Any = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return parsed.get(name) if isinstance(parsed, dict) else None


def agent_id_of(data: str) -> str | None:
    """The `agent_id` of a `wake` event's data, or None when the data is malformed."""
    parsed = event_data(data)
    return str(parsed["agent_id"]) if parsed is not None else None
