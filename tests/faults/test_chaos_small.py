"""The chaos run at a small size (issue 22): every fault kind once, every message answered once.

`scripts/bench chaos` runs the same core (crew_testkit/chaos.py) bigger; here 40
messages from 2 clients to 3 agents on the warm engine, with a fixed seed, through
the real processes, and the count read from the server's database
(crew_testkit/answer_ledger.py) as the benchmark prints it.
"""

from __future__ import annotations

import pytest

from crew_testkit.chaos import CHAOS_KINDS, chaos_plan, run_chaos
from tests.support.computer import need_sandbox

pytestmark = pytest.mark.timeout(400)

SEED = 1


# Before the turn binding (issue 22) some runs of this seed answered twice: a turn shown
# messages by HELD whose Computer was killed after it replied, a reply landing after a
# server paused over 10 s, a finish refused by a full disk. Each has its own test now.
def test_a_small_chaos_run_answers_every_message_exactly_once() -> None:
    need_sandbox()
    said: list[str] = []
    result = run_chaos(chaos_plan(SEED, "small"), say=said.append)
    assert result.ledger is not None
    story = "\n".join(said) + "\n" + result.ledger.summary() + "\n" + result.ledger.details()
    # Not at rest within the plan's quiet timeout: the unread messages, running turns and
    # the Computer's agents then (the database is read again after the Computer stopped).
    assert not result.unrest, f"{result.unrest}\n{story}"
    struck = set(result.faults_by_kind())
    # Without root there is no tmpfs to fill: the disk fault is left out (a note says so).
    assert struck == set(CHAOS_KINDS) - ({"disk"} if result.notes else set()), story
    assert result.ledger.at_rest, story
    assert len(result.ledger.fates) >= 40, story
    assert result.ledger.ok, story
    assert result.computer_exit == 0, story
