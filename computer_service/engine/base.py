"""The engine boundary: run one turn (input, session, model) → events → a result.

The runner and the service only know this interface: `Engine` says all they
ask of an engine (its turns, and what `/agents`, `/health` and `/metrics`
show of it). The real implementation (`computer_service.engine.pipeline.OpenCodeEngine`)
runs OpenCode in the sandbox, cold or on a warm server; `parts.py` chooses it.
Tests swap in a scripted engine, never monkeypatch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol

from crew_common.capabilities import Capabilities
from crew_common.egress import EgressPolicy
from crew_common.permissions import PermissionPolicy


class FailureClass(StrEnum):
    """Why a turn failed: a fixed set a user (and the UI) can act on."""

    NOT_LOGGED_IN = "not_logged_in"
    MODEL_UNAVAILABLE = "model_unavailable"
    RATE_LIMITED = "rate_limited"
    SESSION_INVALID = "session_invalid"
    SANDBOX = "sandbox"
    ENGINE_ERROR = "engine_error"
    PROCESS_CRASHED = "process_crashed"
    OUTPUT_TOO_LARGE = "output_too_large"
    RESOURCE_LIMIT = "resource_limit"
    REPLY_REFUSED = "reply_refused"
    STOPPED = "stopped"


@dataclass(frozen=True)
class Failure:
    """A failure class with a human reason (redacted: no paths, no tokens).

    `environment` marks a failure of the surroundings whatever its class (the
    launcher or the crew server could not be reached): the messages are not to
    blame, so the runner retries them with backoff and never sets them aside.
    """

    cls: FailureClass
    reason: str
    environment: bool = False
    # When the provider said to try again (a rate limit's `Retry-After`), in seconds from now.
    retry_after_s: float | None = None

    def as_upstream(self) -> dict[str, str]:
        return {"class": self.cls.value, "reason": self.reason}


@dataclass
class Usage:
    """Token and cost totals of one turn (sums over its `step_finish` events)."""

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost: float = 0.0
    # What the model gateway counted in the turn (`gateway.usage.TrafficSnapshot.since`):
    # every call, title and summary ones too, as the provider reported it. None: no gateway.
    gateway: dict[str, Any] | None = None

    def as_upstream(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cache_read": self.cache_read,
            "cache_write": self.cache_write,
            "cost": self.cost,
        }


@dataclass(frozen=True)
class EngineEvent:
    """One run-record event in the upstream shape, before the reporter numbers it.

    `type` is one of step_start, text, reasoning, tool_use, step_finish, error,
    other; `at` is RFC 3339; `data` as in upstream.md. `session_id` is the
    engine's session id when the line carried one, and `facts` what failure
    classification needs beyond `data` (e.g. `{"status_code": 401}` of an
    APIError); neither is sent upstream.
    """

    type: str
    at: str
    data: dict[str, Any]
    session_id: str | None = None
    facts: dict[str, Any] | None = None

    def as_upstream(self) -> dict[str, Any]:
        return {"type": self.type, "at": self.at, "data": self.data}


@dataclass(frozen=True)
class SessionPlan:
    """Whether the next turn continues a saved session (`session_id`) or starts anew.

    `agents_md_digest` ties the session the turn ends in to the AGENTS.md the
    plan was made for (the engine's own plans carry it; None: made by hand).
    """

    session_id: str | None
    agents_md_digest: str | None = None

    @property
    def is_new(self) -> bool:
        return self.session_id is None


@dataclass(frozen=True)
class TurnRequest:
    """Everything an engine needs to run one turn of one agent.

    `render_input(new_session)` renders the turn input; the engine calls it
    again with True when it has to restart a vanished session.
    """

    agent_id: str
    model: str
    plan: SessionPlan
    render_input: Callable[[bool], str]
    wall_clock_limit_s: float = 30 * 60
    max_steps: int = 200
    # Where its sandbox may connect (the agent's, crew_common.egress); `public` by default.
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    # Which tool calls run, ask or are refused (the agent's, crew_common.permissions), and
    # where an ask goes (`engine.approvals.ApprovalDesk`, the turn's; None: nobody can be
    # asked, so every ask is refused).
    permission: PermissionPolicy = field(default_factory=PermissionPolicy)
    approvals: Any = None
    # Its own MCP servers and skills (issue 27, `crew_common.capabilities`), secrets in clear:
    # materialised into the engine's config by `engine.preparation` (`engine.capabilities`).
    capabilities: Capabilities = field(default_factory=Capabilities)
    # The turn's trace (computer_service.turn_trace): an engine marks `server_ready`,
    # `prompt_sent` and `engine_accepted` when it gets there; one that does not leaves them out.
    mark: Callable[[str], None] = lambda step: None


@dataclass
class TurnResult:
    """How a turn ended. `status` is what the runner records upstream.

    `session_id` is the session the turn ran in; after a success, the one the
    agent's next turn continues (None: none was kept, the next one starts anew).
    """

    status: Literal["succeeded", "failed", "cancelled"]
    failure: Failure | None = None
    session_id: str | None = None
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class WarmUp:
    """One agent to warm before its next turn (issue 26): what of its settings its turn's
    environment is made of, so the server started now is the one the turn can use."""

    agent_id: str
    model: str
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    permission: PermissionPolicy = field(default_factory=PermissionPolicy)
    capabilities: Capabilities = field(default_factory=Capabilities)


EventSink = Callable[[EngineEvent], Awaitable[None]]


class StopSignal(Protocol):
    """Set when the turn must stop (anyio.Event satisfies this)."""

    def is_set(self) -> bool: ...

    async def wait(self) -> None: ...


class Engine(Protocol):
    """Runs turns. `run_turn` never raises: unexpected errors become `process_crashed`.

    The engine owns its sessions: `plan_session` before a turn, and keeping
    the session of a turn that succeeded is part of `run_turn`.
    """

    name: str

    def plan_session(self, agent_id: str, model: str, agents_md: str) -> SessionPlan:
        """Continue the saved session when engine, model and AGENTS.md are unchanged."""
        ...

    async def run_turn(
        self, request: TurnRequest, on_event: EventSink, stop: StopSignal
    ) -> TurnResult:
        """Run one turn; report each event through `on_event`, in order."""
        ...

    async def maintain(self) -> None:
        """For the service's life (its task group runs it): housekeeping, cleanup when
        cancelled. An engine with nothing to keep returns at once."""
        ...

    def health(self) -> dict[str, object] | None:
        """The `warm` section of `/health` (`WarmHealth`), or None for an engine without servers."""
        ...

    def agent_status(self, agent_id: str) -> dict[str, object]:
        """How this agent's turns run, for `/agents` (`AgentEngine`: at least `engine_mode`)."""
        ...

    def metric_lines(self) -> list[str]:
        """The engine's own Prometheus lines for `/metrics` (none: an empty list)."""
        ...


class Prewarming(Protocol):
    """What an engine that keeps something between turns may add to `Engine` (optional:
    the roster looks for `prewarm` by name, an engine without it is warmed never).

    `prewarm` is a hint: it never runs a turn, never raises (a failure is logged), and
    gives way to the engine's own rules (its memory budget, a busy server).
    """

    async def prewarm(self, agents: Sequence[WarmUp], *, most_recent: int | None = None) -> None:
        """Warm these agents' engines (a person opened or typed in their room). With
        `most_recent` (the Computer's start): only that many of them, the most recently
        active first, and none that never ran a turn here."""
        ...


def prewarm_of(engine: object) -> Callable[..., Awaitable[None]] | None:
    """The engine's `prewarm` (`Prewarming`), or None when it has none."""
    method = getattr(engine, "prewarm", None)
    return method if callable(method) else None
