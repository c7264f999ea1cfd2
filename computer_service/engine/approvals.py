"""A tool call OpenCode asks about, put to the person as an approval card (issue 24).

The warm engine's side of the approvals contract (docs/contracts.md
"Approvals: the engine side"). OpenCode's warm server says `permission.asked`
(`asked_of`) and waits; `AskFlow.decide` creates the approval on the crew
server (the turn's `ApprovalDesk`, bound to the turn by the runner), reports
`approval_asked`, long-polls until the person answered or the approval's
`expires_at` (plus a grace) passed, reports `approval_answered` and says what
to reply to OpenCode: `once`, `always`, or `reject` with a message the agent
reads (so OpenCode goes on with the refusal: a reject with a message is its
`CorrectedError`, which never ends the loop).

Fail closed: no desk, an approval that cannot be created (the server
unreachable after a few short tries, 409 `turn_over`), polls failing until
the deadline — each is a `reject` with the reason, reported as
`permission_denied`, never an `once`.

While a person is asked, the turn's wall-clock limit stands still
(`PersonClock`): an agent waiting 10 minutes for an answer is not a runaway.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import anyio

from computer_service.engine.base import EngineEvent, EventSink
from computer_service.upstream import UpstreamError, UpstreamUnavailable

log = logging.getLogger(__name__)

SUMMARY_LIMIT = 2000
# After the approval's `expires_at` the server expires it on the next read; this long more
# and the engine stops waiting on its own (a server that never answers is a refusal).
EXPIRY_GRACE_S = 5.0
MAX_POLL_S = 30.0
CREATE_TRIES = 3
RETRY_PAUSE_S = 1.0
COLD_REASON = "asks are refused in the cold engine; run the warm engine to be asked"

Reply = Literal["once", "always", "reject"]


@dataclass(frozen=True)
class Asked:
    """One `permission.asked` of OpenCode: what a tool call wants."""

    request_id: str  # OpenCode's `per_…`
    tool: str  # the permission name: bash, edit, external_directory, …
    patterns: list[str]
    always: list[str]  # what "Always" would allow (OpenCode's suggestion)
    summary: str  # what the card shows: the command, the path


class ApprovalState(Protocol):
    """An approval as the crew server answers it (`upstream.Approval`)."""

    id: str
    state: str
    decision: str | None
    reason: str | None
    expires_at: str


class ApprovalDesk(Protocol):
    """Where one turn's asks go: the crew server's approval endpoints for that turn."""

    async def create(self, asked: Asked) -> ApprovalState:
        """`POST /computer/turns/{turn}/approvals`; raises `UpstreamError` when refused."""
        ...

    async def wait(self, approval_id: str, wait_s: float) -> ApprovalState:
        """`GET /computer/approvals/{id}?wait=S`: at once when decided, else after S."""
        ...


def asked_of(event: Any, session_id: str) -> Asked | None:
    """The ask in a `permission.asked` event of the session, or None (untrusted input)."""
    if not isinstance(event, dict) or event.get("type") != "permission.asked":
        return None
    props = event.get("properties")
    if not isinstance(props, dict) or props.get("sessionID") != session_id:
        return None
    request_id, tool = props.get("id"), props.get("permission")
    if not isinstance(request_id, str) or not request_id.startswith("per_"):
        return None
    tool = tool if isinstance(tool, str) and tool else "unknown"
    patterns = _texts(props.get("patterns"))
    always = _texts(props.get("always"))
    metadata = props.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    return Asked(
        request_id[:200], tool[:200], patterns, always, summary_of(tool, patterns, metadata)
    )


def summary_of(tool: str, patterns: list[str], metadata: dict[str, Any]) -> str:
    """What the card says is asked: a bash command, a file path, else the patterns."""
    for key in ("command", "filepath", "filePath", "path", "url"):
        value = metadata.get(key)
        if isinstance(value, str) and value:
            return value[:SUMMARY_LIMIT]
    return (", ".join(patterns) or tool)[:SUMMARY_LIMIT]


def _texts(value: Any) -> list[str]:
    if not isinstance(value, list):
        return []
    return [item[:300] for item in value if isinstance(item, str)][:50]


class PersonClock:
    """A turn's wall clock that stands still while at least one ask waits for a person."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._began = now()
        self._open = 0
        self._paused_since = 0.0
        self._paused_s = 0.0
        self._resumed = anyio.Event()
        self._resumed.set()

    def pause(self) -> None:
        if self._open == 0:
            self._paused_since = self._now()
            self._resumed = anyio.Event()
        self._open += 1

    def resume(self) -> None:
        self._open -= 1
        if self._open == 0:
            self._paused_s += self._now() - self._paused_since
            self._resumed.set()

    @property
    def paused_s(self) -> float:
        """How long the turn has waited for people so far."""
        current = self._now() - self._paused_since if self._open else 0.0
        return self._paused_s + current

    def used(self) -> float:
        """The turn's time so far, without the time it waited for people."""
        return self._now() - self._began - self.paused_s

    async def sleep_until_used(self, limit_s: float) -> None:
        """Return once `limit_s` of the turn's own time has passed."""
        while True:
            await self._resumed.wait()
            left = limit_s - self.used()
            if left <= 0:
                return
            await anyio.sleep(left)


@dataclass(frozen=True)
class Decision:
    """What to reply to OpenCode for one ask."""

    reply: Reply
    message: str | None = None  # with `reject`: what the agent reads

    def body(self) -> dict[str, str]:
        body: dict[str, str] = {"reply": self.reply}
        if self.message is not None:
            body["message"] = self.message
        return body


def refusal(reason: str) -> Decision:
    """A `reject` the agent reads and goes on with (OpenCode's CorrectedError)."""
    return Decision(
        "reject",
        f"Not allowed: {reason}. This tool call did not run. Do not try it again in this turn; "
        "go on without it and tell the person what you could not do and why.",
    )


class AskFlow:
    """The asks of one turn (module doc): each gets its own card, the clock stands still."""

    def __init__(
        self,
        desk: ApprovalDesk | None,
        on_event: EventSink,
        clock: PersonClock,
        *,
        grace_s: float = EXPIRY_GRACE_S,
        retry_pause_s: float = RETRY_PAUSE_S,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.desk = desk
        self.on_event = on_event
        self.clock = clock
        self.grace_s = grace_s
        self.retry_pause_s = retry_pause_s
        self._now = now
        self._pending: set[str] = set()
        self._rejecting: set[str] = set()
        self._changed = anyio.Event()

    async def decide(self, asked: Asked) -> Decision:
        """Ask the person (or refuse, failing closed); reports the turn events. The ask stays
        open until `replied` (OpenCode got the answer)."""
        self._pending.add(asked.request_id)
        return await self._decide(asked)

    def replied(self, request_id: str) -> None:
        """OpenCode has the answer to `request_id` (or closed it itself)."""
        self._pending.discard(request_id)
        self._rejecting.discard(request_id)
        self._kick()

    async def before_reject(self, request_id: str) -> None:
        """Wait until every other open ask that is to be allowed got its answer: OpenCode
        rejects every other pending ask of the session together with a `reject`."""
        self._rejecting.add(request_id)
        self._kick()
        while self._pending - self._rejecting:
            await self._changed.wait()

    def _kick(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _decide(self, asked: Asked) -> Decision:
        if self.desk is None:
            return await self._refused(asked, "the Computer cannot ask anyone in this turn")
        approval = await self._create(asked)
        if isinstance(approval, str):
            return await self._refused(asked, approval)
        await self._event(
            "approval_asked",
            {
                "approval_id": approval.id,
                "tool": asked.tool,
                "patterns": asked.patterns,
                "summary": asked.summary,
            },
        )
        self.clock.pause()
        began = time.monotonic()
        try:
            final = await self._wait(approval)
        finally:
            self.clock.resume()
        waited_s = round(time.monotonic() - began, 3)
        await self._event(
            "approval_answered",
            {
                "approval_id": approval.id,
                "state": final.state,
                "decision": final.decision,
                "reason": final.reason,
                "waited_s": waited_s,
            },
        )
        if final.state == "allowed" and final.decision in ("once", "always"):
            return Decision("always" if final.decision == "always" else "once")
        return refusal(final.reason or _default_reason(final.state))

    async def _create(self, asked: Asked) -> ApprovalState | str:
        """The approval, or why it could not be made (the server's refusal, unreachable)."""
        why = "the crew server could not be reached"
        for attempt in range(CREATE_TRIES):
            try:
                return await self.desk.create(asked)  # type: ignore[union-attr]
            except UpstreamUnavailable as exc:
                why = f"the crew server could not be reached to ask ({exc.status or 'no answer'})"
                if attempt + 1 < CREATE_TRIES:
                    await anyio.sleep(self.retry_pause_s * (attempt + 1))
            except UpstreamError as exc:
                if exc.code == "turn_over":
                    return "the turn is over (the crew server refused to ask for it)"
                return f"the crew server refused to ask ({exc.status} {exc.code})"
        return why

    async def _wait(self, approval: ApprovalState) -> ApprovalState:
        """Long-poll until decided; past `expires_at` + grace (the server silent): expired."""
        deadline = _monotonic_at(approval.expires_at, self._now()) + self.grace_s
        current = approval
        while current.state == "pending":
            left = deadline - time.monotonic()
            if left <= 0:
                return _Expired(approval.id, "no answer in time (the crew server did not say)")
            try:
                current = await self.desk.wait(approval.id, min(MAX_POLL_S, max(left, 0.0)))  # type: ignore[union-attr]
            except UpstreamError as exc:
                log.warning("approval %s: polling failed: %s", approval.id, exc)
                await anyio.sleep(min(self.retry_pause_s, max(deadline - time.monotonic(), 0)))
        return current

    async def _refused(self, asked: Asked, reason: str) -> Decision:
        await self._event(
            "permission_denied", {"tool": asked.tool, "summary": asked.summary, "reason": reason}
        )
        return refusal(reason)

    async def _event(self, kind: str, data: dict[str, Any]) -> None:
        at = self._now().isoformat(timespec="milliseconds").replace("+00:00", "Z")
        await self.on_event(EngineEvent(type=kind, at=at, data=data))


@dataclass
class _Expired:
    id: str
    reason: str | None
    state: str = "expired"
    decision: str | None = None
    expires_at: str = ""


def _default_reason(state: str) -> str:
    return {"denied": "denied by a person", "expired": "no answer in time"}.get(
        state, f"the approval ended {state}"
    )


def _monotonic_at(iso: str, now: datetime) -> float:
    """`iso` (the server's clock) as a `time.monotonic()` instant; unreadable: now + 10 min."""
    try:
        at = datetime.fromisoformat(iso.replace("Z", "+00:00"))
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        return time.monotonic() + (at - now).total_seconds()
    except (ValueError, AttributeError):
        return time.monotonic() + 600.0
