"""The storm benchmark's core at a tiny size (issue 10): faults strike, nothing is lost.

`scripts/bench storm` runs the same core (crew_testkit/storm.py) at 500 messages;
here 30 messages to 3 agents while the launcher is killed (-9) once and the
server restarted once, through the real processes.
"""

from __future__ import annotations

import pytest

from crew_testkit.storm import StormPlan, fault_schedule, run_storm
from tests.support.computer import need_sandbox

pytestmark = pytest.mark.timeout(300)


def test_a_small_storm_with_a_launcher_kill_and_a_server_restart_loses_nothing() -> None:
    need_sandbox()
    plan = StormPlan(
        messages=30,
        agents=3,
        seed=7,
        rate=4.0,
        faults=("launcher", "server"),
        fault_counts={"launcher": 1, "server": 1},
        quiet_timeout_s=150.0,
    )
    said: list[str] = []
    result = run_storm(plan, say=said.append)
    assert result.faults_by_kind() == {"launcher": 1, "server": 1}, said
    assert result.stored >= 30
    assert [(f.token, f.handle) for f in result.lost] == [], "\n".join(said)
    assert result.quiet
    assert result.answered + result.set_aside == result.stored
    # Only a kill -9 of the Computer itself may repeat an answer; none happened here.
    assert [f.token for f in result.answered_twice] == [], result.repeats_by_fault()
    assert result.computer_exit == 0


def test_the_fault_schedule_is_the_seeds_and_strikes_every_kind_within_the_posting() -> None:
    plan = StormPlan(messages=400, rate=8.0, fault_every_s=5.0, seed=3)
    schedule = fault_schedule(plan)
    assert schedule == fault_schedule(plan)
    assert schedule != fault_schedule(StormPlan(messages=400, rate=8.0, fault_every_s=5.0, seed=4))
    assert len(schedule) == 10  # 50 s of posting, a fault every 5 s
    assert {kind for _, kind in schedule} == set(plan.faults)
    assert all(0 < at < plan.posting_s() for at, _ in schedule)
    assert [at for at, _ in schedule] == sorted(at for at, _ in schedule)
    counted = fault_schedule(StormPlan(fault_counts={"server": 2, "disk": 1}))
    assert sorted(kind for _, kind in counted) == ["disk", "server", "server"]
