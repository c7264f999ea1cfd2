"""Budgets per agent (issue 24) in the store: reading the caps and what counts against them.

The caps and the spend are `crew_server.budgets` (pure); `budget_holds` holds the
claim, posts the notices and resumes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from crew_server.budgets import (
    Budget,
    BudgetError,
    CapState,
    cap_states,
    held_detail,
    held_until,
    month_start,
    spend_of,
)
from crew_server.clock import iso, parse_iso
from crew_server.errors import InvalidBudget
from crew_server.store.db import Transaction


def stored_budget(value: Any) -> str | None:
    """A budget in the user's form checked and normalised as stored (None: no budget, every
    cap unset); `InvalidBudget` (422) with the reason."""
    try:
        budget = Budget.parse(value)
    except BudgetError as exc:
        raise InvalidBudget(str(exc)) from exc
    return orjson.dumps(budget.as_json()).decode() if budget.is_set() else None


def read_budget(stored: str | None) -> Budget:
    """A stored budget (None: no budget)."""
    return Budget.parse(orjson.loads(stored)) if stored else Budget()


def cap_states_of(tx: Transaction, agent_id: str, budget: Budget, now: datetime) -> list[CapState]:
    """The agent's set caps against its spend this day and month (turns by start time)."""
    if not budget.is_set():
        return []
    rows = tx.execute(
        "SELECT started_at, usage, gateway_usage FROM turns "
        "WHERE agent_id = ? AND started_at >= ? AND usage IS NOT NULL",
        (agent_id, iso(month_start(now))),
    ).fetchall()
    turns = (
        (
            parse_iso(r["started_at"]),
            orjson.loads(r["usage"]),
            orjson.loads(r["gateway_usage"]) if r["gateway_usage"] else None,
        )
        for r in rows
    )
    return cap_states(budget, spend_of(turns, now), now)


def budget_state(
    tx: Transaction, agent_id: str, stored: str | None, extra_turns: int
) -> dict[str, Any] | None:
    """An agent's budget as the user API shows it (None: no budget): whether it is held,
    until when and why, what it spent this day and month, and a granted "resume once"."""
    budget = read_budget(stored)
    if not budget.is_set():
        return None
    now = tx_now(tx)
    states = cap_states_of(tx, agent_id, budget, now)
    until = held_until(states)
    spent = {s.cap: s.spent for s in states}
    return {
        "held": until is not None,
        "until": iso(until) if until is not None else None,
        "detail": held_detail(states, until) if until is not None else None,
        "spent": {
            "daily_usd": spent.get("daily_usd"),
            "monthly_usd": spent.get("monthly_usd"),
            "monthly_tokens": int(spent["monthly_tokens"]) if "monthly_tokens" in spent else None,
        },
        "resume_once": extra_turns > 0,
    }


def tx_now(tx: Transaction) -> datetime:
    """The transaction's clock time as a datetime."""
    return parse_iso(tx.now())
