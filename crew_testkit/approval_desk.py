"""A scripted approval desk (`engine.approvals.ApprovalDesk`) for engine tests without a crew server.

Each ask creates a pending approval; the test answers it (`answer`) or lets
it expire (`expires_in_s`); `wait` long-polls like the server's
`GET /computer/approvals/{id}?wait=S`. `create_errors` are raised, one per
create, before an approval is made (an unreachable server, a 409).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio

from computer_service.engine.approvals import Asked
from computer_service.upstream import Approval


@dataclass
class FakeDesk:
    """Approvals kept in memory; `answer` decides one as a person would."""

    expires_in_s: float = 600.0
    # Decide every new approval at once with this decision ("once", "always", "deny").
    auto: str | None = None
    create_errors: list[Exception] = field(default_factory=list)
    wait_errors: list[Exception] = field(default_factory=list)
    asked: list[Asked] = field(default_factory=list)
    approvals: dict[str, Approval] = field(default_factory=dict)
    polls: int = 0
    _changed: anyio.Event = field(default_factory=anyio.Event)

    async def create(self, asked: Asked) -> Approval:
        if self.create_errors:
            raise self.create_errors.pop(0)
        for existing in self.approvals.values():
            if existing.id == f"apr_{asked.request_id}":
                return existing
        self.asked.append(asked)
        expires = datetime.now(UTC) + timedelta(seconds=self.expires_in_s)
        approval = Approval(
            id=f"apr_{asked.request_id}",
            turn_id="turn",
            state="pending",
            expires_at=expires.isoformat(),
        )
        self.approvals[approval.id] = approval
        self._kick()
        if self.auto is not None:
            self.answer(approval.id, self.auto)
        return self.approvals[approval.id]

    def answer(self, approval_id: str, decision: str, by: str = "@user") -> None:
        """Decide a pending approval as a person (`deny` gives the reason "denied by @user")."""
        approval = self.approvals[approval_id]
        assert approval.state == "pending", approval
        allowed = decision in ("once", "always")
        self.approvals[approval_id] = approval.model_copy(
            update={
                "state": "allowed" if allowed else "denied",
                "decision": decision,
                "reason": None if allowed else f"denied by {by}",
            }
        )
        self._kick()

    def pending(self) -> list[Approval]:
        return [a for a in self.approvals.values() if a.state == "pending"]

    async def wait_for_pending(self, count: int = 1) -> list[Approval]:
        """Wait until `count` approvals are pending (a card is up)."""
        while len(self.pending()) < count:
            await self._changed.wait()
        return self.pending()

    async def wait(self, approval_id: str, wait_s: float) -> Approval:
        self.polls += 1
        if self.wait_errors:
            raise self.wait_errors.pop(0)
        with anyio.move_on_after(wait_s):
            while self.approvals[approval_id].state == "pending":
                await self._changed.wait()
        approval = self.approvals[approval_id]
        if approval.state == "pending" and datetime.now(UTC) >= _at(approval.expires_at):
            approval = approval.model_copy(
                update={"state": "expired", "reason": f"no answer within {self.expires_in_s:g} s"}
            )
            self.approvals[approval_id] = approval
        return approval

    def _kick(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()


def _at(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


def approval_events(events: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """The approval and permission events of a turn, in order."""
    kinds = ("approval_asked", "approval_answered", "permission_denied")
    return [(e.type, e.data) for e in events if e.type in kinds]
