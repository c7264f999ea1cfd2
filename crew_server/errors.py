"""Typed errors the API turns into `{"error": {"code", "message"}}` answers."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A failure the caller can act on: an HTTP status, a stable code and an English message."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        """The JSON answer for this error."""
        return {"error": {"code": self.code, "message": self.message, **self.extra}}


class BadRequest(ApiError):
    status = 400
    code = "bad_request"


class BadJson(ApiError):
    status = 400
    code = "bad_json"


class Invalid(ApiError):
    status = 422
    code = "invalid"


class UnknownModel(Invalid):
    """An agent's model its Computer cannot run; `nearest` lists the closest it reported."""

    code = "unknown_model"

    def __init__(self, message: str, nearest: list[str]) -> None:
        super().__init__(message, extra={"nearest": nearest})


class InvalidEgress(Invalid):
    """An agent's egress policy `crew_common.egress` cannot read; the message says why."""

    code = "invalid_egress"


class InvalidBudget(Invalid):
    """An agent's budget `crew_server.budgets` cannot take; the message says why."""

    code = "invalid_budget"


class InvalidPermission(Invalid):
    """An agent's permission policy `crew_common.permissions` cannot read; the message says why."""

    code = "invalid_permission"


class InvalidCapabilities(Invalid):
    """An agent's MCP servers or skills `crew_common.capabilities` cannot take; the message
    says why."""

    code = "invalid_capabilities"


class Unauthorized(ApiError):
    status = 401
    code = "unauthorized"


class Forbidden(ApiError):
    status = 403
    code = "forbidden"


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Refused(ApiError):
    """A refusal a user should read (`crew` prints the message as is)."""

    status = 409
    code = "refused"


class Conflict(ApiError):
    status = 409
    code = "conflict"


class StaleTurn(ApiError):
    """The turn is no longer running, or a newer connection of its Computer exists."""

    status = 409
    code = "stale_turn"


class ApprovalClosed(ApiError):
    """An answer to an approval that is no longer pending (answered, expired, its turn over)."""

    status = 409
    code = "approval_closed"


class NotConnected(ApiError):
    status = 409
    code = "not_connected"


class TooLarge(ApiError):
    status = 413
    code = "too_large"


class Held(ApiError):
    """A reply held back because the agent has not seen newer messages in that room."""

    status = 409
    code = "held"

    def __init__(self, agent_id: str, rooms: list[dict[str, Any]]) -> None:
        super().__init__("new messages arrived in this room; read them, then send again or not")
        self.agent_id = agent_id
        self.rooms = rooms

    def body(self) -> dict[str, Any]:
        return {"held": True, "agent_id": self.agent_id, "rooms": self.rooms}


class Superseded(ApiError):
    """The request comes from a connection of its Computer that a newer one replaced."""

    status = 409
    code = "superseded"


class StorageFull(ApiError):
    """The server's disk is full: nothing was written; the same request works once space is back."""

    status = 503
    code = "storage_full"


class NotAnswered(ApiError):
    """A conditional ack of a turn whose agent did not reply in every room of it."""

    status = 409
    code = "not_answered"


class DatabaseUnavailable(ApiError):
    """PostgreSQL cannot take the request now (the connection was lost, or conflicting
    writers kept winning): nothing was written; the same request works again soon."""

    status = 503
    code = "database_unavailable"
