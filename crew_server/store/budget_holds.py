"""Budgets per agent (issue 24) in the store: the hold at claim time, the notices, resuming.

The caps and what counts against them are `crew_server.budgets` (pure). The claim asks
`budget_hold` before it hands out messages: an agent at 100 % of a cap gets nothing (its
messages stay unread) and the claim's answer says why and until when. The 80 % and 100 %
notices go once per cap and period (`budget_notices`) into the rooms of the turn that
crossed the line (posted when it finishes), or at a hold into the rooms whose messages
wait. Notices wake nobody. Raising a cap, resuming once, and the period's end wake the
agent, so its waiting messages are answered at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import orjson

from crew_server.budgets import CapState, held_detail, held_until, reached_notice, warn_notice
from crew_server.clock import iso, parse_iso
from crew_server.errors import NotFound
from crew_server.store.budgets import budget_state, cap_states_of, read_budget, tx_now
from crew_server.store.db import StorePart, Transaction
from crew_server.store.identities import Actor

# By module: posting (messages) imports the claim (positions), which asks `budget_hold`.
from crew_server.store import messages  # isort: skip


def post_due_notices(
    tx: Transaction, agent_id: str, handle: str, states: Iterable[CapState], rooms: Sequence[str]
) -> None:
    """The 80 % and 100 % notices not yet posted this period, into `rooms`. A cap that went
    past both at once gets the 100 % one only."""
    until = held_until(states)
    for state in states:
        top = state.level()
        if not top or not rooms:
            continue
        new = {
            level: tx.execute(
                "INSERT INTO budget_notices (agent_id, cap, period, level, posted_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (agent_id, state.cap, state.period, level, tx.now()),
            ).rowcount
            == 1
            for level in (80, 100)
            if level <= top
        }
        if not new[top]:
            continue
        body = (
            reached_notice(handle, state, until or state.resumes_at)
            if top == 100
            else warn_notice(handle, state)
        )
        # Caused by the agent: it has seen it when it was caught up (no turn for it).
        actor = Actor("agent", agent_id, handle)
        for room_id in dict.fromkeys(rooms):
            messages.post(tx, room_id, None, body, caused_by=actor)


def budget_hold(tx: Transaction, agent_id: str, waiting: Sequence[str]) -> dict[str, Any] | None:
    """At claim time: None when the agent may take a turn, else why not (the claim then
    hands out nothing) as `{"reason": "budget", "until", "detail"}`.

    `waiting` are the rooms with unread messages. A "resume once" the user granted lets one
    claim with messages through. A held agent's `budget_held_until` is set, so the
    scheduler wakes it when the period ends.
    """
    row = tx.execute(
        "SELECT handle, budget, budget_extra_turns, budget_held_until FROM agents WHERE id = ?",
        (agent_id,),
    ).fetchone()
    states = cap_states_of(tx, agent_id, read_budget(row["budget"]), tx_now(tx))
    until = held_until(states)
    if until is None:
        if row["budget_held_until"] is not None:
            tx.execute("UPDATE agents SET budget_held_until = NULL WHERE id = ?", (agent_id,))
        return None
    if waiting and row["budget_extra_turns"] > 0:
        tx.execute(
            "UPDATE agents SET budget_extra_turns = budget_extra_turns - 1, "
            "budget_held_until = NULL WHERE id = ?",
            (agent_id,),
        )
        return None
    tx.execute("UPDATE agents SET budget_held_until = ? WHERE id = ?", (iso(until), agent_id))
    post_due_notices(tx, agent_id, row["handle"], states, waiting)
    return {"reason": "budget", "until": iso(until), "detail": held_detail(states, until)}


def budget_after_turn(tx: Transaction, turn_id: str) -> None:
    """A turn finished: the notices its spend made due, into the turn's rooms."""
    turn = tx.execute(
        "SELECT t.agent_id, t.rooms, a.handle, a.budget FROM turns t "
        "JOIN agents a ON a.id = t.agent_id WHERE t.id = ?",
        (turn_id,),
    ).fetchone()
    budget = read_budget(turn["budget"])
    if not budget.is_set():
        return
    states = cap_states_of(tx, turn["agent_id"], budget, tx_now(tx))
    rooms = [r["room_id"] for r in orjson.loads(turn["rooms"])]
    post_due_notices(tx, turn["agent_id"], turn["handle"], states, rooms)


class Budgets(StorePart):
    """Resuming a held agent, and waking the agents whose period ended."""

    def resume_budget(self, agent_id: str) -> dict[str, Any]:
        """The user lets a held agent take exactly one more turn (not cumulative: asking
        twice is one turn); it is woken. Its budget state after."""
        with self._database.write() as tx:
            row = tx.execute("SELECT budget FROM agents WHERE id = ?", (agent_id,)).fetchone()
            if row is None:
                raise NotFound(f"no agent {agent_id}")
            tx.execute(
                "UPDATE agents SET budget_extra_turns = 1, budget_held_until = NULL WHERE id = ?",
                (agent_id,),
            )
            tx.wake([agent_id])
            return {"budget_state": budget_state(tx, agent_id, row["budget"], 1)}

    def next_budget_release_at(self) -> datetime | None:
        """When the next held agent's period ends (None: none is held)."""
        with self._database.read() as tx:
            row = tx.execute(
                "SELECT MIN(budget_held_until) AS at FROM agents WHERE budget_held_until IS NOT NULL"
            ).fetchone()
        return parse_iso(row["at"]) if row and row["at"] else None

    def release_budget_holds(self) -> int:
        """Wake every held agent whose period ended (its claim checks the caps again)."""
        with self._database.write() as tx:
            tx.serialize("budgets")
            due = [
                r["id"]
                for r in tx.execute(
                    "SELECT id FROM agents WHERE budget_held_until IS NOT NULL "
                    "AND budget_held_until <= ? ORDER BY id",
                    (tx.now(),),
                )
            ]
            tx.executemany(
                "UPDATE agents SET budget_held_until = NULL WHERE id = ?", [(a,) for a in due]
            )
            tx.wake(due)
        return len(due)
