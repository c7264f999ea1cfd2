"""Budgets per agent (issue 24): the caps, the periods, what a turn spent, and the notices.

Pure: the store reads the agent's caps and its turns' usage and asks these functions
whether the agent is held and which notice is due. Periods are UTC calendar periods: a
day from 00:00 UTC, a month from the 1st at 00:00 UTC. A turn counts in the period it
started in.

A turn's cost is the model gateway's figure where its `gateway_usage` has one, else the
engine's (`usage.cost`, from the price table). Its tokens are the gateway's input +
output where the turn ran through the gateway (it sees every model call, title and
summary calls too), else the engine's input + output + reasoning. Cache reads and writes
are not counted as tokens (their price is in the cost).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

CAPS = ("daily_usd", "monthly_usd", "monthly_tokens")
# The share of a cap at which the room gets its warning notice.
WARN_AT = 0.8
# A cap the store keeps: below a trillion dollars or tokens (a larger one is no cap).
MAX_CAP = 1e12


class BudgetError(ValueError):
    """A budget the server cannot take; the message says what is wrong."""


@dataclass(frozen=True)
class Budget:
    """An agent's caps; None is unset. All unset is no budget."""

    daily_usd: float | None = None
    monthly_usd: float | None = None
    monthly_tokens: int | None = None

    @classmethod
    def parse(cls, value: Any) -> Budget:
        """The user's form (`{"daily_usd", "monthly_usd", "monthly_tokens"}`, any absent or
        null; None: no budget) → `Budget`; `BudgetError` with the reason otherwise."""
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise BudgetError(
                f"a budget is an object with {', '.join(CAPS)} (each a number or null), "
                f"not {type(value).__name__}"
            )
        unknown = sorted(str(k) for k in value if k not in CAPS)
        if unknown:
            raise BudgetError(
                f"a budget has no field {', '.join(unknown)}; its fields are {', '.join(CAPS)}"
            )
        caps: dict[str, float | int | None] = {}
        for name in CAPS:
            cap = value.get(name)
            if cap is None:
                caps[name] = None
                continue
            if isinstance(cap, bool) or not isinstance(cap, int | float):
                raise BudgetError(f"{name} must be a number or null, not {cap!r}")
            if not math.isfinite(cap):
                raise BudgetError(f"{name} must be a finite number, not {cap!r}")
            if cap < 0:
                raise BudgetError(f"{name} cannot be below zero (got {cap!r}); null removes it")
            if cap > MAX_CAP:
                raise BudgetError(f"{name} must be at most {MAX_CAP:.0f}; null removes it")
            if name == "monthly_tokens":
                if cap != int(cap):
                    raise BudgetError(f"monthly_tokens must be a whole number, not {cap!r}")
                caps[name] = int(cap)
            else:
                caps[name] = float(cap)
        return cls(
            daily_usd=caps["daily_usd"],
            monthly_usd=caps["monthly_usd"],
            monthly_tokens=caps["monthly_tokens"],  # type: ignore[arg-type]
        )

    def is_set(self) -> bool:
        """Whether any cap is set."""
        return any(getattr(self, name) is not None for name in CAPS)

    def as_json(self) -> dict[str, float | int | None]:
        """The caps as the API shows them (every field, null when unset)."""
        return {name: getattr(self, name) for name in CAPS}


@dataclass(frozen=True)
class Spend:
    """What an agent spent in the current day and month."""

    day_usd: float = 0.0
    month_usd: float = 0.0
    month_tokens: int = 0


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value) if value >= 0 else None
    return None


def turn_cost(usage: Mapping[str, Any] | None, gateway: Mapping[str, Any] | None) -> float:
    """A turn's cost in USD: the gateway's figure where it has one, else the engine's."""
    for source in (gateway, usage):
        if source is not None:
            cost = _number(source.get("cost"))
            if cost is not None:
                return cost
    return 0.0


def turn_tokens(usage: Mapping[str, Any] | None, gateway: Mapping[str, Any] | None) -> int:
    """A turn's tokens: the gateway's input + output, else the engine's input + output +
    reasoning (cache reads and writes not counted)."""
    if gateway is not None:
        fields: tuple[str, ...] = ("input_tokens", "output_tokens")
        source: Mapping[str, Any] = gateway
    elif usage is not None:
        fields, source = ("input_tokens", "output_tokens", "reasoning_tokens"), usage
    else:
        return 0
    return int(sum(_number(source.get(f)) or 0 for f in fields))


def day_start(now: datetime) -> datetime:
    """00:00 UTC of `now`'s day."""
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def month_start(now: datetime) -> datetime:
    """00:00 UTC of the 1st of `now`'s month."""
    return day_start(now).replace(day=1)


def next_day(now: datetime) -> datetime:
    """00:00 UTC of the day after `now`'s."""
    return day_start(now) + timedelta(days=1)


def next_month(now: datetime) -> datetime:
    """00:00 UTC of the 1st of the month after `now`'s."""
    start = month_start(now)
    return (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )


def spend_of(turns: Iterable[tuple[datetime, Any, Any]], now: datetime) -> Spend:
    """The day's and month's spend of `(started_at, usage, gateway_usage)` turns (the
    month's; earlier ones are ignored)."""
    day, month = day_start(now), month_start(now)
    day_usd = month_usd = 0.0
    tokens = 0
    for started, usage, gateway in turns:
        if started < month:
            continue
        cost = turn_cost(usage, gateway)
        month_usd += cost
        tokens += turn_tokens(usage, gateway)
        if started >= day:
            day_usd += cost
    return Spend(day_usd=day_usd, month_usd=month_usd, month_tokens=tokens)


@dataclass(frozen=True)
class CapState:
    """One set cap against its spend in the current period."""

    cap: str  # one of CAPS
    limit: float
    spent: float
    period: str  # `2026-12-02` or `2026-12`: the notices' key
    resumes_at: datetime  # the start of the next period

    @property
    def share(self) -> float:
        """Spent over the cap (a cap of 0 is reached at once)."""
        if self.limit <= 0:
            return math.inf
        return self.spent / self.limit

    @property
    def reached(self) -> bool:
        """At 100 % or over: the agent's turns are held."""
        return self.spent >= self.limit

    def level(self) -> int:
        """100 (reached), 80 (warned) or 0."""
        if self.reached:
            return 100
        return 80 if self.share >= WARN_AT else 0


def cap_states(budget: Budget, spend: Spend, now: datetime) -> list[CapState]:
    """Every set cap of `budget` with its spend, in `CAPS` order."""
    day, month = day_start(now), month_start(now)
    periods = {
        "daily_usd": (spend.day_usd, day.strftime("%Y-%m-%d"), next_day(now)),
        "monthly_usd": (spend.month_usd, month.strftime("%Y-%m"), next_month(now)),
        "monthly_tokens": (float(spend.month_tokens), month.strftime("%Y-%m"), next_month(now)),
    }
    states = []
    for name in CAPS:
        limit = getattr(budget, name)
        if limit is not None:
            spent, period, resumes = periods[name]
            states.append(CapState(name, float(limit), spent, period, resumes))
    return states


def held_until(states: Iterable[CapState]) -> datetime | None:
    """When the agent's turns resume by themselves: the latest period end of the reached
    caps (None: no cap is reached)."""
    reached = [s.resumes_at for s in states if s.reached]
    return max(reached) if reached else None


CAP_TEXTS = {
    "daily_usd": "daily budget",
    "monthly_usd": "monthly budget",
    "monthly_tokens": "monthly token budget",
}


def amount(state: CapState, value: float) -> str:
    """A cap's amount as a person reads it: `$5.00`, `1,000,000 tokens`."""
    if state.cap == "monthly_tokens":
        return f"{int(value):,} tokens"
    value = round(value, 6)  # sums of turns' costs carry float noise
    if value == round(value, 2):
        return f"${value:,.2f}"
    return f"${value:,.6f}".rstrip("0")  # a small cap, or a spend in fractions of a cent


def resume_text(moment: datetime) -> str:
    """When a period ends, as a notice says it: `00:00 UTC on 2026-12-03`."""
    return moment.strftime("%H:%M UTC on %Y-%m-%d")


def warn_notice(handle: str, state: CapState) -> str:
    """The room's notice at 80 % of a cap."""
    return (
        f"@{handle} has used {min(state.share, 9.99):.0%} of its {CAP_TEXTS[state.cap]} "
        f"({amount(state, state.spent)} of {amount(state, state.limit)}); at 100 % its new "
        "turns wait until the period ends or the cap is raised"
    )


def reached_notice(handle: str, state: CapState, until: datetime) -> str:
    """The room's notice at 100 % of a cap."""
    return (
        f"@{handle} reached its {CAP_TEXTS[state.cap]} ({amount(state, state.limit)}); its "
        f"messages wait until {resume_text(until)} or until you raise the cap or resume it once"
    )


def held_detail(states: Iterable[CapState], until: datetime | None) -> str:
    """Why the agent is held, in one line (for the claim's answer and the agent's state)."""
    reached = [s for s in states if s.reached]
    caps = ", ".join(
        f"{CAP_TEXTS[s.cap]} {amount(s, s.spent)} of {amount(s, s.limit)}" for s in reached
    )
    when = f"until {resume_text(until)} or " if until is not None else "until "
    return f"budget reached ({caps}); its messages wait {when}the cap is raised or it is resumed"
