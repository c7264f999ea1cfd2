"""The Computer's counters, rendered as Prometheus text for `GET /metrics`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from typing import Protocol

from crew_common.version import VERSION

# Turn durations range from a no-op fake engine to a 30-minute limit.
DURATION_BUCKETS_S = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
TURN_RESULTS = ("succeeded", "failed", "cancelled")


@dataclass
class Histogram:
    """A cumulative-bucket histogram (Prometheus `histogram` type)."""

    buckets: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        """Count one value into its buckets."""
        self.count += 1
        self.total += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1


class UsageNumbers(Protocol):
    """What a turn's usage carries (`engine.base.Usage`)."""

    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cache_read: int
    cache_write: int
    cost: float


@dataclass
class AgentUsage:
    """Tokens and cost of one agent's finished turns, as the engine reported them."""

    handle: str
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost: float = 0.0

    def add(self, usage: UsageNumbers) -> None:
        """Count one finished turn's usage."""
        self.turns += 1
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.reasoning_tokens += usage.reasoning_tokens
        self.cache_read += usage.cache_read
        self.cache_write += usage.cache_write
        self.cost += usage.cost


class Metrics:
    """Turns by result, turn durations, report batches, the live queue length, and
    tokens and cost per agent (since start, and today on this machine's calendar)."""

    def __init__(self) -> None:
        self.turns: dict[str, int] = dict.fromkeys(TURN_RESULTS, 0)
        self.turn_duration = Histogram(DURATION_BUCKETS_S)
        self.batches_sent = 0
        self.batches_dropped = 0
        self.events_reported = 0
        # Read at render time: the gate owns the live numbers.
        self.queue_length: Callable[[], int] = lambda: 0
        self.running_turns: Callable[[], int] = lambda: 0
        # The `/events` bus owns these.
        self.event_readers: Callable[[], int] = lambda: 0
        self.events_missed: Callable[[], int] = lambda: 0
        self.usage: dict[str, AgentUsage] = {}
        # Connections the agents' egress policies refused: agent id → (handle, count).
        self.denials: dict[str, tuple[str, int]] = {}
        self._today: dict[str, AgentUsage] = {}
        # The calendar day on this machine; a test sets it to cross midnight.
        self.clock: Callable[[], date] = date.today
        self._day = self.clock()
        # More lines from other parts (the warm engine's counters), rendered last.
        self.sections: list[Callable[[], list[str]]] = []

    def turn_finished(self, status: str, duration_s: float) -> None:
        """Count one finished turn and its duration."""
        self.turns[status] = self.turns.get(status, 0) + 1
        self.turn_duration.observe(duration_s)

    def usage_reported(self, agent_id: str, handle: str, usage: UsageNumbers) -> None:
        """Count one finished turn's tokens and cost for its agent."""
        self.usage.setdefault(agent_id, AgentUsage(handle)).add(usage)
        self.usage[agent_id].handle = handle
        self._roll_day()
        self._today.setdefault(agent_id, AgentUsage(handle)).add(usage)

    def egress_denied(self, agent_id: str, handle: str, count: object) -> None:
        """Count one `egress_denied` event: `count` refusals it sums up (1 when it says
        no number)."""
        many = count if isinstance(count, int) and not isinstance(count, bool) else 1
        _, before = self.denials.get(agent_id, (handle, 0))
        self.denials[agent_id] = (handle, before + max(many, 0))

    def today(self, agent_id: str) -> AgentUsage:
        """This agent's usage since local midnight (zeros if none)."""
        self._roll_day()
        return self._today.get(agent_id) or AgentUsage(handle="")

    def _roll_day(self) -> None:
        if (day := self.clock()) != self._day:
            self._day = day
            self._today.clear()

    def render(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        lines = [
            "# HELP crew_turns_total Turns finished, by result.",
            "# TYPE crew_turns_total counter",
        ]
        lines += [f'crew_turns_total{{result="{r}"}} {n}' for r, n in sorted(self.turns.items())]
        h = self.turn_duration
        lines += [
            "# HELP crew_turn_duration_seconds How long turns took, from claim to finish.",
            "# TYPE crew_turn_duration_seconds histogram",
        ]
        lines += [
            f'crew_turn_duration_seconds_bucket{{le="{bound:g}"}} {n}'
            for bound, n in zip(h.buckets, h.counts, strict=True)
        ]
        lines += [
            f'crew_turn_duration_seconds_bucket{{le="+Inf"}} {h.count}',
            f"crew_turn_duration_seconds_sum {h.total:.6f}",
            f"crew_turn_duration_seconds_count {h.count}",
            "# HELP crew_report_batches_total Event batches reported upstream, by outcome.",
            "# TYPE crew_report_batches_total counter",
            f'crew_report_batches_total{{outcome="sent"}} {self.batches_sent}',
            f'crew_report_batches_total{{outcome="dropped"}} {self.batches_dropped}',
            "# HELP crew_events_reported_total Engine events handed to the reporter.",
            "# TYPE crew_events_reported_total counter",
            f"crew_events_reported_total {self.events_reported}",
            "# HELP crew_turn_queue_length Turns waiting for a free slot.",
            "# TYPE crew_turn_queue_length gauge",
            f"crew_turn_queue_length {self.queue_length()}",
            "# HELP crew_running_turns Turns holding a slot now.",
            "# TYPE crew_running_turns gauge",
            f"crew_running_turns {self.running_turns()}",
            "# HELP crew_event_readers Open GET /events streams.",
            "# TYPE crew_event_readers gauge",
            f"crew_event_readers {self.event_readers()}",
            "# HELP crew_events_missed_total Events /events readers were told they missed.",
            "# TYPE crew_events_missed_total counter",
            f"crew_events_missed_total {self.events_missed()}",
            "# HELP crew_computer_build_info The running Computer's version.",
            "# TYPE crew_computer_build_info gauge",
            f'crew_computer_build_info{{version="{_label(VERSION)}"}} 1',
        ]
        lines += self._usage_lines()
        lines += self._denial_lines()
        for section in self.sections:
            lines += section()
        return "\n".join(lines) + "\n"

    def _usage_lines(self) -> list[str]:
        families = (
            ("crew_agent_turns_total", "Turns finished, per agent.", "turns"),
            ("crew_agent_input_tokens_total", "Input tokens, per agent.", "input_tokens"),
            ("crew_agent_output_tokens_total", "Output tokens, per agent.", "output_tokens"),
            (
                "crew_agent_reasoning_tokens_total",
                "Reasoning tokens, per agent.",
                "reasoning_tokens",
            ),
            (
                "crew_agent_cache_read_tokens_total",
                "Tokens read from the cache, per agent.",
                "cache_read",
            ),
            (
                "crew_agent_cache_write_tokens_total",
                "Tokens written to the cache, per agent.",
                "cache_write",
            ),
            (
                "crew_agent_cost_total",
                "Cost as the engine reported it (the provider's currency, usually USD), per agent.",
                "cost",
            ),
        )
        lines: list[str] = []
        if not self.usage:
            return lines  # no agent finished a turn yet: no family without samples
        for name, text, attribute in families:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} counter"]
            for agent_id, usage in sorted(self.usage.items()):
                labels = f'agent_id="{_label(agent_id)}",handle="{_label(usage.handle)}"'
                value = getattr(usage, attribute)
                shown = f"{value:.6f}" if isinstance(value, float) else str(value)
                lines.append(f"{name}{{{labels}}} {shown}")
        return lines

    def _denial_lines(self) -> list[str]:
        if not self.denials:
            return []  # no refusal yet: no family without samples
        name = "crew_agent_egress_denials_total"
        lines = [
            f"# HELP {name} Connections the agent's egress policy refused, per agent.",
            f"# TYPE {name} counter",
        ]
        for agent_id, (handle, count) in sorted(self.denials.items()):
            lines.append(
                f'{name}{{agent_id="{_label(agent_id)}",handle="{_label(handle)}"}} {count}'
            )
        return lines


def _label(value: str) -> str:
    """A Prometheus label value: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
