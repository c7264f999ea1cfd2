"""The pure rules of budgets (crew_server.budgets): reading caps, UTC periods, what a turn
counts, levels and the hold's end."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest

from crew_server.budgets import (
    Budget,
    BudgetError,
    Spend,
    cap_states,
    held_until,
    next_day,
    next_month,
    spend_of,
    turn_cost,
    turn_tokens,
)

NOW = datetime(2026, 12, 31, 23, 59, tzinfo=UTC)


def test_caps_are_read_and_normalised() -> None:
    assert Budget.parse(None) == Budget() and not Budget().is_set()
    budget = Budget.parse({"daily_usd": 5, "monthly_tokens": 1000.0})
    assert budget.as_json() == {"daily_usd": 5.0, "monthly_usd": None, "monthly_tokens": 1000}
    assert isinstance(budget.monthly_tokens, int) and budget.is_set()


@pytest.mark.parametrize(
    "value",
    [
        {"daily_usd": -0.01},
        {"daily_usd": math.nan},
        {"monthly_usd": math.inf},
        {"monthly_usd": False},
        {"monthly_tokens": 2.5},
        {"weekly_usd": 1},
        "5",
    ],
)
def test_what_is_no_cap_is_refused(value: Any) -> None:
    with pytest.raises(BudgetError):
        Budget.parse(value)


def test_periods_are_utc_and_december_rolls_into_january() -> None:
    assert next_day(NOW) == datetime(2027, 1, 1, tzinfo=UTC)
    assert next_month(NOW) == datetime(2027, 1, 1, tzinfo=UTC)
    assert next_month(datetime(2026, 2, 28, 12, tzinfo=UTC)) == datetime(2026, 3, 1, tzinfo=UTC)


def test_a_turn_counts_the_gateway_where_it_has_a_figure() -> None:
    engine = {"input_tokens": 10, "output_tokens": 5, "reasoning_tokens": 2, "cost": 0.5}
    gateway = {"input_tokens": 100, "output_tokens": 50}
    assert turn_tokens(engine, gateway) == 150 and turn_tokens(engine, None) == 17
    assert turn_cost(engine, gateway) == 0.5  # the gateway has no price: the engine's
    assert turn_cost(engine, {**gateway, "cost": 0.7}) == 0.7
    assert turn_cost({"cost": -1}, None) == 0.0 and turn_tokens(None, None) == 0


def test_spend_is_of_the_day_and_the_month() -> None:
    turns = [
        (datetime(2026, 11, 30, 23, tzinfo=UTC), {"cost": 9.0}, None),  # last month
        (datetime(2026, 12, 30, 10, tzinfo=UTC), {"cost": 1.0, "input_tokens": 3}, None),
        (datetime(2026, 12, 31, 1, tzinfo=UTC), {"cost": 2.0, "output_tokens": 4}, None),
    ]
    assert spend_of(turns, NOW) == Spend(day_usd=2.0, month_usd=3.0, month_tokens=7)


def test_levels_and_the_end_of_a_hold() -> None:
    budget = Budget(daily_usd=10, monthly_usd=100, monthly_tokens=0)
    states = cap_states(budget, Spend(day_usd=8, month_usd=99.99, month_tokens=0), NOW)
    assert [(s.cap, s.level()) for s in states] == [
        ("daily_usd", 80),
        ("monthly_usd", 80),
        ("monthly_tokens", 100),  # a cap of 0 is reached at once
    ]
    assert [s.period for s in states] == ["2026-12-31", "2026-12", "2026-12"]
    assert held_until(states) == datetime(2027, 1, 1, tzinfo=UTC)
    below = cap_states(Budget(daily_usd=10), Spend(day_usd=7.99), NOW)
    assert below[0].level() == 0 and held_until(below) is None
