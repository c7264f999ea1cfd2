"""All durable state of the reference server, behind one class: `Store`.

`Store` is the sum of its parts, one module per aggregate: `identities` (user,
Computers, agents, tokens), `rooms`, `messages`, `positions` (and the unread
claim), `turns`, `tasks`, `reminders`, `mutes`, `user_reads` (the web app's unread
counts), `writes` (idempotency keys of agent writes), `loop_guard` (agents paused where they
answer each other without end), `budget_holds` (agents held at a budget cap), `approvals`
(the cards an `ask` rule puts to the person), `room_activity` (the room's status line:
who works, whose turns failed), `removals` (deleting agents, rooms and Computers; a
group's name and members), `controls` (a person's Stop and Wake), `capabilities` (an agent's MCP servers and
skills); `db` holds the
connection, the transactions, the migrations and the SSE event log. Each part runs its
statements through a `db.Transaction`; what parts share (a room's row, posting
a message, claiming a room) are plain functions of a transaction.

The backend is chosen by the location `Store` is opened with (`db.open_database`):
a SQLite file (or `:memory:`), or a `postgresql://` URL that several server
processes share (`postgres`). Every public method is one attempt of the backend
(`Database.attempt`): PostgreSQL runs it again when a concurrent writer in
another process conflicted with it. The rules that need no database live in
`crew_server.rules`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from crew_server.clock import Clock
from crew_server.store.approvals import Approvals
from crew_server.store.budget_holds import Budgets
from crew_server.store.capabilities import AgentCapabilities
from crew_server.store.controls import Controls
from crew_server.store.db import EVENT_LOG_KEEP, PRUNE_EVERY, EventLog, open_database
from crew_server.store.identities import USER, Actor, AgentIdentity, Identities, hash_token
from crew_server.store.loop_guard import LoopGuard
from crew_server.store.messages import Messages
from crew_server.store.mutes import Mutes
from crew_server.store.positions import CLAIM_MAX_CHARS, CLAIM_MAX_MESSAGES, Positions
from crew_server.store.reminders import Reminders
from crew_server.store.removals import Removals
from crew_server.store.room_activity import RoomActivity
from crew_server.store.rooms import Rooms
from crew_server.store.tasks import Tasks
from crew_server.store.turns import Turns
from crew_server.store.user_reads import UserReads
from crew_server.store.writes import AgentWrites

__all__ = [
    "CLAIM_MAX_CHARS",
    "CLAIM_MAX_MESSAGES",
    "EVENT_LOG_KEEP",
    "USER",
    "Actor",
    "AgentIdentity",
    "Store",
    "hash_token",
]


class Store(
    Identities,
    Rooms,
    Messages,
    Positions,
    Turns,
    Tasks,
    Reminders,
    Mutes,
    UserReads,
    AgentWrites,
    LoopGuard,
    Budgets,
    Approvals,
    Controls,
    RoomActivity,
    Removals,
    AgentCapabilities,
    EventLog,
):
    """The server's durable state and the operations on it (see the package docstring)."""

    def __init__(
        self,
        location: str,
        clock: Clock,
        *,
        event_log_keep: int = EVENT_LOG_KEEP,
        prune_every: int = PRUNE_EVERY,
        claim_max_messages: int = CLAIM_MAX_MESSAGES,
        claim_max_chars: int = CLAIM_MAX_CHARS,
    ) -> None:
        self.clock = clock
        self._claim_max_messages = claim_max_messages
        self._claim_max_chars = claim_max_chars
        self._database = open_database(
            location, clock, event_log_keep=event_log_keep, prune_every=prune_every
        )

    @property
    def dialect(self) -> str:
        """`sqlite` or `postgresql`."""
        return self._database.dialect

    async def follow_other_processes(
        self, notify: Callable[[set[str]], None], notify_all: Callable[[], None]
    ) -> None:
        """Tell `notify` which Computers got SSE events committed by other server
        processes until cancelled, `notify_all` when some may have gone unheard
        (returns at once on SQLite: one process)."""
        await self._database.follow_other_processes(notify, notify_all)

    @property
    def listener(self) -> Callable[[set[str]], None] | None:
        """Called after a commit with the ids of Computers that have new SSE events."""
        return self._database.listener

    @listener.setter
    def listener(self, listener: Callable[[set[str]], None] | None) -> None:
        self._database.listener = listener

    @property
    def changed_listener(self) -> Callable[[], None] | None:
        """Called after a commit that changed rows, ours or another process's."""
        return self._database.changed_listener

    @changed_listener.setter
    def changed_listener(self, listener: Callable[[], None] | None) -> None:
        self._database.changed_listener = listener

    def close(self) -> None:
        """Close the database connection."""
        self._database.close()


def _attempted(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` run as one attempt of the backend (retried on a write conflict)."""

    @functools.wraps(method)
    def attempt(self: Store, *args: Any, **kwargs: Any) -> Any:
        return self._database.attempt(lambda: method(self, *args, **kwargs))

    return attempt


# Every public operation of the parts: each runs at most one write transaction (then
# maybe a read), so running it again after a conflict is the same as running it once.
for _part in Store.__mro__[1:]:
    for _name, _method in list(vars(_part).items()):
        if _name.startswith("_") or not callable(_method) or _name in vars(Store):
            continue
        setattr(Store, _name, _attempted(_method))
