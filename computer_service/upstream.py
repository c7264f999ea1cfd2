"""The upstream client: the Computer's HTTP calls to the crew server (upstream.md).

One `Upstream` wraps an `httpx.AsyncClient` with the Computer's bearer token.
Answers are validated with pydantic; every failure a caller can act on is its
own error type (`StaleTurn` for a fenced-out write, `Superseded` for a
connection another one replaced, `Unauthorized`, …). After `connect`, every
request carries the connection's epoch (`Crew-Epoch`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar

import httpx
import orjson
from httpx_sse import EventSource, aconnect_sse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from crew_common.capabilities import Capabilities, CapabilitiesError
from crew_common.capabilities import parse as parse_capabilities
from crew_common.egress import EgressError, EgressPolicy
from crew_common.permissions import PermissionPolicy, PolicyError

log = logging.getLogger(__name__)

T = TypeVar("T", bound=BaseModel)

# The server pings every 15 s; three missed pings mean the stream is dead.
SSE_READ_TIMEOUT_S = 45.0
# Event ids are integers on the reference server; a longer one is garbage, not an id.
MAX_EVENT_ID_CHARS = 256


class UpstreamError(Exception):
    """A call to the crew server failed. `status` is the HTTP status, if any."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


class UpstreamUnavailable(UpstreamError):
    """The server could not be reached or answered 5xx; retrying later may work."""


class Unauthorized(UpstreamError):
    """The server refused the Computer's credential (401)."""


class StaleTurn(UpstreamError):
    """409 `stale_turn`: another Computer (or a newer connection) owns this agent now."""


class Superseded(UpstreamError):
    """409 `superseded`: a newer connection with this Computer's token replaced this one.

    Nothing this process sends is accepted any more: it must stop without ack.
    """


class UpstreamRejected(UpstreamError):
    """The server refused the request (4xx other than 401 and stale_turn)."""


class BadAnswer(UpstreamError):
    """The server answered something that does not match the upstream contract."""


# --- answers -----------------------------------------------------------------


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ConnectAnswer(_Answer):
    """`POST /computer/connect`: who we are and this connection's epoch."""

    computer_id: str
    epoch: int
    server_time: str


class AgentRecord(_Answer):
    """An agent assigned to this Computer; the settings whose change replaces its runner."""

    id: str = Field(min_length=1, max_length=100)
    handle: str
    name: str
    persona: str = ""
    engine: str = "opencode"
    model: str
    # This agent's own wall-clock limit of one turn (None: the bootstrap's). Not a
    # setting that replaces the runner: that would end the very turn it is raised for.
    turn_time_limit_s: float | None = Field(default=None, gt=0, le=7 * 24 * 3600)
    # Where its sandbox may connect (issue 23), read from the server's form with
    # `crew_common.egress`; a server without the field means the default (`public`).
    egress: EgressPolicy = Field(default_factory=EgressPolicy)
    # Why the server's policy could not be read: the agent's problem, so it never runs
    # with a policy the user did not set (`egress` is then `none`, and unused).
    egress_problem: str | None = None
    # Which tool calls run, ask the person or are refused (issue 24, `crew_common.permissions`);
    # a server without the field means the default (`autonomous`). Not a setting that
    # replaces the runner: a person's "Always" changes it during the very turn that asked.
    permission: PermissionPolicy = Field(default_factory=PermissionPolicy)
    # Its own MCP servers and skills (issue 27, `crew_common.capabilities`), secrets in
    # clear; `capabilities_version` the server's digest of them. Not a setting that replaces
    # the runner: the next turn's config differs, so its warm server is started afresh
    # (`warm_pool.env_key`) and its session goes on.
    capabilities: Capabilities = Field(default_factory=Capabilities)
    capabilities_version: str | None = None
    # Why the server's capabilities could not be read: the agent's problem (as the egress
    # policy's), so it never runs without the tools its user gave it, unnoticed.
    capabilities_problem: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _read_capabilities(cls, data: Any) -> Any:
        if not isinstance(data, dict) or isinstance(data.get("capabilities"), Capabilities):
            return data
        try:
            return {**data, "capabilities": parse_capabilities(data.get("capabilities"))}
        except CapabilitiesError as exc:
            problem = f"its capabilities (MCP servers, skills) cannot be used: {exc}"
            return {**data, "capabilities": Capabilities(), "capabilities_problem": problem}

    def problem(self) -> str | None:
        """Why this agent must not run as the server describes it (None: it can)."""
        return self.egress_problem or self.capabilities_problem

    @model_validator(mode="before")
    @classmethod
    def _read_permission(cls, data: Any) -> Any:
        if not isinstance(data, dict) or isinstance(data.get("permission"), PermissionPolicy):
            return data
        try:
            return {**data, "permission": PermissionPolicy.parse(data.get("permission"))}
        except PolicyError as exc:
            # Fail closed: a policy the Computer cannot read runs as read-only, every ask
            # refused (the server checks policies, so only a newer server's can get here).
            log.warning("agent %s: its permission policy cannot be used: %s", data.get("id"), exc)
            return {**data, "permission": PermissionPolicy(preset="read-only")}

    @model_validator(mode="before")
    @classmethod
    def _read_egress(cls, data: Any) -> Any:
        if not isinstance(data, dict) or isinstance(data.get("egress"), EgressPolicy):
            return data
        try:
            return {
                **data,
                "egress": EgressPolicy.parse(data.get("egress")),
                "egress_problem": None,
            }
        except EgressError as exc:
            problem = f"its egress policy from the server cannot be used: {exc}"
            return {**data, "egress": EgressPolicy(mode="none"), "egress_problem": problem}

    def settings(self) -> tuple[str, str, str, str, str, EgressPolicy, str | None, str | None]:
        """The fields that, when changed, require a new runner (computer.md §1); a new
        egress policy does too, as a running sandbox cannot be given another one."""
        return (
            self.name,
            self.handle,
            self.persona,
            self.engine,
            self.model,
            self.egress,
            self.egress_problem,
            self.capabilities_problem,
        )

    def egress_summary(self) -> str:
        """The policy in one line for `/agents` (`EgressPolicy.summary`)."""
        return "unusable (see problem)" if self.egress_problem else self.egress.summary()


class Approval(_Answer):
    """An approval card (docs/contracts.md "Approvals"): what was asked and its state."""

    id: str = Field(min_length=1, max_length=200)
    turn_id: str = ""
    state: Literal["pending", "allowed", "denied", "expired"]
    decision: Literal["once", "always", "deny"] | None = None
    reason: str | None = Field(default=None, max_length=4000)
    expires_at: str


class TurnApprovals:
    """One turn's approval desk (`engine.approvals.ApprovalDesk`) on the crew server."""

    def __init__(self, upstream: Upstream, turn_id: str) -> None:
        self.upstream = upstream
        self.turn_id = turn_id

    async def create(self, asked: Any) -> Approval:
        body = {
            "request_id": asked.request_id,
            "tool": asked.tool,
            "patterns": asked.patterns,
            "always": asked.always,
            "summary": asked.summary,
        }
        path = f"/computer/turns/{self.turn_id}/approvals"
        return await self.upstream._call("POST", path, body, Approval)

    async def wait(self, approval_id: str, wait_s: float) -> Approval:
        return await self.upstream.approval(approval_id, wait_s)


class TokenAnswer(_Answer):
    """A new agent token."""

    token: str = Field(min_length=1)


class RoomRef(BaseModel):
    """A room as the server sends it; the fields we rely on, everything else kept."""

    model_config = ConfigDict(extra="allow")
    id: str
    kind: str


class MessageRef(BaseModel):
    """A message as the server sends it; the fields we rely on, everything else kept."""

    model_config = ConfigDict(extra="allow")
    id: str
    seq: int


class UnreadRoom(BaseModel):
    """One room of the unread answer with its messages (by `seq`)."""

    model_config = ConfigDict(extra="allow")
    room: RoomRef
    messages: list[MessageRef]

    def seq_range(self) -> tuple[int, int]:
        """The first and last sequence number of the unread messages."""
        seqs = [m.seq for m in self.messages]
        return min(seqs), max(seqs)


class ClaimPause(_Answer):
    """Why a claim handed out no turn (issue 24: `budget`, a cap of the agent's is reached)
    and when it ends by itself (None: not by itself); the server wakes the agent then."""

    reason: str
    until: str | None = None
    detail: str = ""

    def text(self) -> str:
        """The hold in one line, as the agent's status shows it."""
        until = f" until {self.until}" if self.until else ""
        return f"{self.reason}{until}: {self.detail}" if self.detail else f"{self.reason}{until}"


class UnreadAnswer(_Answer):
    """`POST …/unread`."""

    rooms: list[UnreadRoom]
    paused: ClaimPause | None = None


class ClaimedRooms(list[UnreadRoom]):
    """The rooms of an unread claim; `paused` says why an empty one is no turn now."""

    paused: ClaimPause | None = None


class RegisteredTurn(_Answer):
    """A registered turn: its id, the fence every later write carries, and the identity
    its `crew` presents (None from a server older than issue 22)."""

    turn_id: str
    fence: int
    turn_secret: str | None = None


class TurnRoom(BaseModel):
    """Which messages of one room a turn handles."""

    room_id: str
    from_seq: int
    to_seq: int


class _ErrorBody(_Answer):
    code: str = "error"
    message: str = ""


class _ErrorAnswer(_Answer):
    error: _ErrorBody


# --- client ------------------------------------------------------------------


class Upstream:
    """The crew server as seen by this Computer (`Authorization: Bearer <computer token>`)."""

    def __init__(
        self,
        server_url: str,
        token: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 10.0,
        sse_read_timeout_s: float = SSE_READ_TIMEOUT_S,
    ) -> None:
        self.server_url = server_url.rstrip("/")
        if transport is None and self.server_url.startswith("http://"):
            # No TLS to verify on http:// (and redirects are not followed): skip
            # loading the CA bundle, ~30 ms of start-up before `ready`.
            transport = httpx.AsyncHTTPTransport(verify=False)
        # The event stream's watchdog: this long without a byte (not even a ping) is a dead stream.
        self._sse_read_timeout_s = sse_read_timeout_s
        # The epoch `connect` returned; sent with every later request.
        self.epoch: int | None = None
        self._client = httpx.AsyncClient(
            base_url=self.server_url,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "crew-computer"},
            timeout=httpx.Timeout(timeout_s),
            transport=transport,
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    # Connection and agents.

    async def connect(
        self, hostname: str, platform: str, version: str, capacity: int
    ) -> ConnectAnswer:
        """`POST /computer/connect`: confirm the address and the credential; get an epoch."""
        body = {
            "hostname": hostname,
            "platform": platform,
            "version": version,
            "capacity": capacity,
        }
        answer = await self._call("POST", "/computer/connect", body, ConnectAnswer)
        self.epoch = answer.epoch
        self._client.headers["Crew-Epoch"] = str(answer.epoch)
        return answer

    async def agents(self) -> list[AgentRecord]:
        """`GET /computer/agents`: the agents assigned to this Computer."""
        data = await self._call_raw("GET", "/computer/agents", None)
        if not isinstance(data, list):
            raise BadAnswer("GET /computer/agents did not answer a list")
        return [_validate(AgentRecord, item, "GET /computer/agents") for item in data]

    async def put_models(self, models: list[str]) -> None:
        """`PUT /computer/models`: the models this Computer can run."""
        await self._call_raw("PUT", "/computer/models", {"models": models})

    async def set_problem(self, agent_id: str, reason: str) -> None:
        """Tell the server (and so the user) why this agent cannot run."""
        await self._call_raw("PUT", f"/computer/agents/{agent_id}/problem", {"reason": reason})

    async def put_capabilities_state(
        self, agent_id: str, version: str, servers: list[dict[str, Any]]
    ) -> None:
        """`PUT …/capabilities/state`: what this Computer applied of the agent's capabilities
        (their `capabilities_version`) and each MCP server's state (issue 27)."""
        body = {"capabilities_version": version, "mcp_servers": servers}
        await self._call_raw("PUT", f"/computer/agents/{agent_id}/capabilities/state", body)

    async def clear_problem(self, agent_id: str) -> None:
        """`DELETE …/problem`: the agent can run again."""
        await self._call_raw("DELETE", f"/computer/agents/{agent_id}/problem", None)

    async def issue_token(self, agent_id: str) -> str:
        """`POST …/token`: a new token for the agent's `crew` command."""
        answer = await self._call("POST", f"/computer/agents/{agent_id}/token", None, TokenAnswer)
        return answer.token

    # One turn.

    async def claim_unread(self, agent_id: str, max_messages: int | None = None) -> ClaimedRooms:
        """`POST …/unread`: the unread messages by room; the server marks them delivered.

        `max_messages` narrows the claim to that many of the oldest messages. An agent the
        server holds (its budget) gets none, and `paused` says why.
        """
        body = {"max_messages": max_messages} if max_messages is not None else None
        path = f"/computer/agents/{agent_id}/unread"
        answer = await self._call("POST", path, body, UnreadAnswer)
        rooms = ClaimedRooms(room for room in answer.rooms if room.messages)
        rooms.paused = answer.paused
        return rooms

    async def register_turn(
        self,
        agent_id: str,
        rooms: list[TurnRoom],
        turn_input: str,
        engine: str,
        model: str,
        session_id: str | None,
    ) -> RegisteredTurn:
        """`POST …/turns`: record a turn (rooms, whole input); its id and fence."""
        body = {
            "rooms": [r.model_dump() for r in rooms],
            "input": turn_input,
            "engine": engine,
            "model": model,
            "session_id": session_id,
        }
        return await self._call("POST", f"/computer/agents/{agent_id}/turns", body, RegisteredTurn)

    async def report_events(
        self, turn_id: str, fence: int, first_index: int, events: list[dict[str, Any]]
    ) -> None:
        """`POST /computer/turns/{id}/events`: one batch, numbered from `first_index`."""
        body = {"fence": fence, "first_index": first_index, "events": events}
        await self._call_raw("POST", f"/computer/turns/{turn_id}/events", body)

    async def finish_turn(
        self,
        turn_id: str,
        fence: int,
        status: Literal["succeeded", "failed", "cancelled"],
        failure: dict[str, str] | None,
        usage: dict[str, Any],
        event_count: int | None = None,
        engine_input: str | None = None,
        gateway_usage: dict[str, Any] | None = None,
        trace: dict[str, int] | None = None,
    ) -> None:
        """`POST /computer/turns/{id}/finish`: the turn's result.

        `event_count` is how many events the turn produced, sent or not: the
        server records a missing tail as a gap. `engine_input` is the input the
        engine got when it is not the registered one (a vanished session restarted).
        `gateway_usage` is what the model gateway counted over the turn (upstream's
        `GatewayUsage`); None when no gateway ran. `trace`: where the turn's time went
        (`turn_trace.TurnTrace.as_upstream`).
        """
        body: dict[str, Any] = {
            "fence": fence,
            "status": status,
            "failure": failure,
            "usage": usage,
        }
        if event_count is not None:
            body["event_count"] = event_count
        if engine_input is not None:
            body["input"] = engine_input
        if gateway_usage is not None:
            body["gateway_usage"] = gateway_usage
        if trace:
            body["trace"] = trace
        await self._call_raw("POST", f"/computer/turns/{turn_id}/finish", body)

    async def ack(
        self,
        agent_id: str,
        turn_id: str,
        fence: int,
        set_aside: dict[str, str] | None = None,
        *,
        only_if_answered: bool = False,
    ) -> None:
        """`POST …/ack`: the read position moves to the delivered position.

        With `set_aside` (`{"reason": …}`) the messages are marked read unanswered
        and the server posts a notice in each room saying so.
        """
        body: dict[str, Any] = {"turn_id": turn_id, "fence": fence}
        if set_aside is not None:
            body["set_aside"] = set_aside
        if only_if_answered:
            # 409 `not_answered` (an UpstreamRejected) when a room got no reply.
            body["only_if_answered"] = True
        await self._call_raw("POST", f"/computer/agents/{agent_id}/ack", body)

    # Approvals (issue 24).

    async def approval(self, approval_id: str, wait_s: float) -> Approval:
        """`GET /computer/approvals/{id}?wait=S`: answers once decided, or after S seconds."""
        wait = max(0, min(30, int(wait_s)))
        path = f"/computer/approvals/{approval_id}?wait={wait}"
        data = await self._call_raw("GET", path, None, timeout_s=wait + 10.0)
        return _validate(Approval, data, f"GET /computer/approvals/{approval_id}")

    # The event stream.

    @asynccontextmanager
    async def events(self, last_event_id: str | None) -> AsyncIterator[EventSource]:
        """Open `GET /computer/events` (SSE); raise an `UpstreamError` unless it is a 200 stream."""
        headers = {}
        if last_event_id and _sendable_event_id(last_event_id):
            headers["Last-Event-ID"] = last_event_id
        elif last_event_id:
            # Without it the stream starts at now; the sync after every connect catches up.
            log.warning(
                "the server's last event id %.60r cannot be sent back as a header; "
                "resuming without it",
                last_event_id,
            )
        timeout = httpx.Timeout(10.0, read=self._sse_read_timeout_s)
        try:
            async with aconnect_sse(
                self._client, "GET", "/computer/events", headers=headers, timeout=timeout
            ) as source:
                response = source.response
                if response.status_code != 200:
                    await response.aread()
                    raise _error_of(response, "GET /computer/events")
                yield source
        except httpx.TransportError as exc:
            raise UpstreamUnavailable(f"event stream failed: {_describe(exc)}") from exc

    # Plumbing.

    async def _call(self, method: str, path: str, body: Any, answer: type[T]) -> T:
        data = await self._call_raw(method, path, body)
        return _validate(answer, data, f"{method} {path}")

    async def _call_raw(
        self, method: str, path: str, body: Any, *, timeout_s: float | None = None
    ) -> Any:
        what = f"{method} {path}"
        content = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if content is not None else None
        extra: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
        try:
            response = await self._client.request(
                method, path, content=content, headers=headers, **extra
            )
        except httpx.TransportError as exc:
            raise UpstreamUnavailable(
                f"{what}: cannot reach the crew server at {self.server_url} ({_describe(exc)}); "
                "check that it is running"
            ) from exc
        if response.status_code >= 300:
            raise _error_of(response, what)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise BadAnswer(f"{what}: the server answered non-JSON") from None


def _sendable_event_id(event_id: str) -> bool:
    """Printable ASCII of a sane length: anything else cannot go back as `Last-Event-ID`."""
    return len(event_id) <= MAX_EVENT_ID_CHARS and all(" " <= ch <= "~" for ch in event_id)


def _validate(model: type[T], data: Any, what: str) -> T:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadAnswer(f"{what}: unexpected answer ({exc.error_count()} problems)") from None


def _describe(exc: httpx.TransportError) -> str:
    return str(exc) or type(exc).__name__


def _error_of(response: httpx.Response, what: str) -> UpstreamError:
    """Turn a non-2xx answer into the typed error a caller can act on."""
    code, message = "error", ""
    try:
        parsed = _ErrorAnswer.model_validate(orjson.loads(response.content))
        code, message = parsed.error.code, parsed.error.message
    except (orjson.JSONDecodeError, ValidationError):
        message = response.text[:200]
    status = response.status_code
    text = f"{what}: {status} {code}" + (f": {message}" if message else "")
    if status == 401:
        return Unauthorized(
            f"{text}; the Computer token was refused — create a new one", status=status, code=code
        )
    if status == 409 and code == "stale_turn":
        return StaleTurn(text, status=status, code=code)
    if status == 409 and code == "superseded":
        return Superseded(
            f"{text}; another Computer connected with this Computer's token",
            status=status,
            code=code,
        )
    if status >= 500 or status in (408, 429):
        # Busy or timed out (a proxy, a rate limit): later may work.
        return UpstreamUnavailable(text, status=status, code=code)
    return UpstreamRejected(text, status=status, code=code)
