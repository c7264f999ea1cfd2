"""A warm turn whose sandbox ran into a resource limit fails as a cold one at that limit.

The classification is pure (`end_at_limit`, then the cold `attempt_result`),
and the engine asks the launcher after every warm turn; here the launcher's
answer is scripted (the stand-in server of `test_warm_untrusted`), the real
cgroup and OpenCode are `tests/e2e/test_warm_limits.py`'s.
"""

from __future__ import annotations

import anyio
import pytest

from computer_service.engine.attempt import Attempt, attempt_result
from computer_service.engine.base import Failure, FailureClass, TurnResult
from computer_service.engine.warm_run import WarmAttempt, end_at_limit
from crew_common.launcher_wire import LIMIT_HITS, ExitFrame
from tests.computer_unit.test_warm_untrusted import (
    FINAL,
    IDLE,
    StandIn,
    engine,
    part,
    turn,
)
from tests.computer_unit.test_warm_untrusted import standin as standin_fixture

standin = standin_fixture  # the stand-in server, as a fixture of this module too
SECRETS = ["/crew/agents/a"]


def cold_at_limit(hit: str) -> TurnResult:
    """What the cold engine makes of a run the launcher ended at `hit`."""
    a = Attempt(lines=2)
    a.exit = ExitFrame(t="exit", code=None, signal=9, stderr_tail="", reason=hit)
    return attempt_result(a, anyio.Event(), SECRETS)


def warm(**fields: object) -> WarmAttempt:
    a = WarmAttempt(prompt_sent=True, lines=2)
    for name, value in fields.items():
        setattr(a, name, value)
    return a


@pytest.mark.parametrize("hit", LIMIT_HITS)
@pytest.mark.parametrize("how", ["finished", "stream_ended", "error_line"])
def test_a_limit_hit_is_the_cold_runs_resource_limit_however_the_stream_ended(
    hit: str, how: str
) -> None:
    if how == "finished":
        a = warm(exit=ExitFrame(t="exit", code=0, stderr_tail=""))
    elif how == "stream_ended":  # the launcher killed the server mid-turn
        crashed = Failure(FailureClass.PROCESS_CRASHED, "the warm OpenCode server went away")
        a = warm(broken="its event stream ended during the turn", launcher_failure=crashed)
    else:  # the tool's OOM kill made the model give up
        a = warm(exit=ExitFrame(t="exit", code=1, stderr_tail="Error: killed"))
    end_at_limit(a, hit)
    result = attempt_result(a, anyio.Event(), SECRETS)
    assert result.status == "failed" and result.failure is not None
    assert result.failure == cold_at_limit(hit).failure
    assert result.failure.cls is FailureClass.RESOURCE_LIMIT
    assert a.broken is not None  # the server is dropped


def test_what_came_first_wins_as_in_a_cold_run() -> None:
    stopped = anyio.Event()
    stopped.set()
    a = warm(exit=ExitFrame(t="exit", code=0, stderr_tail=""))
    end_at_limit(a, "memory_limit")
    assert attempt_result(a, stopped, SECRETS).status == "cancelled"

    a = warm(ending="timeout", time_limit_s=60.0)
    end_at_limit(a, "process_limit")
    result = attempt_result(a, anyio.Event(), SECRETS)
    assert result.failure is not None and result.failure.cls is FailureClass.ENGINE_ERROR

    over = ExitFrame(t="exit", code=0, stderr_tail="", reason="output_too_large")
    a = warm(ending="output", exit=over)
    end_at_limit(a, "memory_limit")
    result = attempt_result(a, anyio.Event(), SECRETS)
    assert result.failure is not None and result.failure.cls is FailureClass.OUTPUT_TOO_LARGE
    assert a.broken is not None


FINISHED_TURN = [
    part("step-start"),
    part("text", text="ok", time={"start": 1, "end": 2}),
    part("step-finish", reason="stop", tokens={"input": 3, "output": 2}, cost=0.5),
    FINAL,
    IDLE,
]


@pytest.mark.anyio
async def test_a_turn_that_finished_after_a_limit_hit_fails_and_drops_its_server(
    standin: tuple[StandIn, int],
) -> None:
    # A tool was OOM-killed and the model answered before the launcher's watch looked.
    server, port = standin
    server.script = FINISHED_TURN
    warm_engine, cold, launcher = engine(port)
    launcher.limit_hit = "memory_limit"
    result, events = await turn(warm_engine)
    assert result.status == "failed" and result.failure is not None
    assert result.failure == cold_at_limit("memory_limit").failure
    assert [e.type for e in events] == ["step_start", "text", "step_finish"]
    assert result.usage.input_tokens == 3  # what the turn used still counts
    assert launcher.stopped == ["a"] and cold.cold_turns == 0


@pytest.mark.anyio
async def test_a_server_killed_at_a_limit_mid_turn_is_resource_limit_not_a_crash(
    standin: tuple[StandIn, int],
) -> None:
    server, port = standin
    server.script = [part("step-start")]  # then nothing: the launcher killed it
    warm_engine, _, launcher = engine(port)
    launcher.limit_hit = "process_limit"
    result, _ = await turn(warm_engine)
    assert result.failure == cold_at_limit("process_limit").failure
    assert launcher.stopped == ["a"]


@pytest.mark.anyio
async def test_without_a_limit_hit_the_turn_and_its_server_stay_as_they_were(
    standin: tuple[StandIn, int],
) -> None:
    server, port = standin
    server.script = FINISHED_TURN
    warm_engine, _, launcher = engine(port)
    result, _ = await turn(warm_engine)
    assert result.status == "succeeded" and launcher.stopped == []
