"""A model answering 429 with `Retry-After: 600` (a quota window), the real OpenCode (issue 20).

Before: OpenCode waits the 600 s itself, silently, and the turn sat until the
wall clock (30 min by default) and ended `engine_error`. Now the warm engine
reads OpenCode's `session.status` `retry` (its `next`), ends the turn at once
as `rate_limited`, and the runner tries the agent again at the provider's time
(its `retry_at` on the Computer's `/agents` row), not after 5 s. A cold run
says only (in its log, passed on by the launcher as `log` frames) that a
request failed and no new one started: past OpenCode's own longest retry
(30 s) the turn ends as `rate_limited`; the model gateway saw the 429 and its
`Retry-After`, so it too is tried again at the provider's time (issue 23).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from crew_harness.waiting import wait_until
from tests.e2e.chain import ENGINE_MODES, Chain, running_chain

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

RETRY_AFTER_S = 600


@pytest.fixture(scope="module", params=ENGINE_MODES)
def chain(request: pytest.FixtureRequest) -> Iterator[Chain]:
    with running_chain(engine_mode=request.param) as started:
        yield started


def test_a_429_with_retry_after_ends_the_turn_as_rate_limited_retried_then(chain: Chain) -> None:
    chain.script(
        [
            {
                "role": "user",
                "match": "QUOTA-1",
                "reply": {
                    "error": {
                        "status": 429,
                        "message": "quota exceeded (scripted)",
                        "retry_after": RETRY_AFTER_S,
                    }
                },
            }
        ]
    )
    agent = chain.agent("quota")
    room = chain.dm(agent["id"])
    chain.post(room["id"], "QUOTA-1: hello")
    # The turn limit is 30 min: a turn that waits for OpenCode's retry would not end here.
    [turn] = chain.finished_turns(agent["id"], 1, timeout=90)
    assert turn["status"] == "failed", (turn, chain.diagnostics())
    assert turn["failure"]["class"] == "rate_limited", turn["failure"]
    assert "quota exceeded" in turn["failure"]["reason"]

    # Retried at the provider's time, about 600 s from the end of the turn: warm from
    # OpenCode's `retry` status, cold from the model gateway, which saw the answer (a
    # cold run's log does not say it; issue 23).
    expected = RETRY_AFTER_S

    def agent_row() -> dict[str, Any] | None:
        with chain.computer.introspection() as local:
            found: dict[str, Any] = local.get(f"/agents/{agent['id']}").json()
        return found if found.get("retry_at") else None

    row = wait_until("the agent's retry time", agent_row, timeout=30)
    retry_at = datetime.fromisoformat(row["retry_at"])
    ended = datetime.fromisoformat(turn["finished_at"])
    assert expected - 30 <= (retry_at - ended).total_seconds() <= expected + 5, row
    assert row["last_reason"] and "rate limiting" in row["last_reason"]
    # One model request for the turn (OpenCode was stopped before its own retry).
    quota = [r for r in chain.model.requests() if "QUOTA-1" in r.last_text()]
    assert len(quota) == 1, [(r.number, r.at, r.answer, r.session) for r in quota]
