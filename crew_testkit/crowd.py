"""Many agents woken at once: what each turn's tool recorded, and how many overlapped.

A crowd test's message runs `CROWD_TOOL` in every agent's turn: it writes the
instants its tool started and ended (ns) into the agent's work dir. On the
host, no instant may lie inside more runs than the Computer's turn cap.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

CROWD_TOOL = "FAKE:RUN date +%s%N > t0; sleep 0.1; date +%s%N > t1"


def tool_spans(crew_home: Path, agent_ids: Iterable[str]) -> list[tuple[int, int]]:
    """(start, end) of each agent's tool run, in ns."""
    spans = []
    for agent_id in agent_ids:
        work = crew_home / "agents" / agent_id / "work"
        spans.append((int((work / "t0").read_text()), int((work / "t1").read_text())))
    return spans


def peak_overlap(spans: list[tuple[int, int]]) -> int:
    """The most spans any one instant lies inside."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running, peak = 0, 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak
