"""The Computer's counters, rendered as Prometheus text for `GET /metrics`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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


class Metrics:
    """Turns by result, turn durations, report batches, and the live queue length."""

    def __init__(self) -> None:
        self.turns: dict[str, int] = dict.fromkeys(TURN_RESULTS, 0)
        self.turn_duration = Histogram(DURATION_BUCKETS_S)
        self.batches_sent = 0
        self.batches_dropped = 0
        self.events_reported = 0
        # Read at render time: the gate owns the live numbers.
        self.queue_length: Callable[[], int] = lambda: 0
        self.running_turns: Callable[[], int] = lambda: 0
        # More lines from other parts (the warm engine's counters), rendered last.
        self.sections: list[Callable[[], list[str]]] = []

    def turn_finished(self, status: str, duration_s: float) -> None:
        """Count one finished turn and its duration."""
        self.turns[status] = self.turns.get(status, 0) + 1
        self.turn_duration.observe(duration_s)

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
        ]
        for section in self.sections:
            lines += section()
        return "\n".join(lines) + "\n"
