"""The pure rules of delivery at the edges: backoff, narrowing, set aside, refused replies."""

from __future__ import annotations

import orjson
import pytest

from computer_service.delivery import Retries
from computer_service.engine.base import EngineEvent, Failure, FailureClass
from computer_service.engine.events import engine_event_of
from computer_service.engine.failures import (
    ReplyAttempts,
    blames_content,
    blames_environment,
    set_aside_reason,
)
from crew_shim.reply import HELD_FIRST

AT = "2026-01-01T00:00:00.000+00:00"
HELD_TEXT = f"{HELD_FIRST}\n\n[room r1]\nnews\n\nRun crew reply again to send as is or with changes, or do nothing.\n"
CRASH = Failure(FailureClass.PROCESS_CRASHED, "OpenCode was killed by signal 9")


def test_the_backoff_doubles_from_5_s_to_5_min() -> None:
    retries = Retries()
    delays = [retries.next_delay() for _ in range(9)]
    assert delays == [5, 10, 20, 40, 80, 160, 300, 300, 300]
    retries.forget()
    assert retries.next_delay() == 5


@pytest.mark.parametrize(
    "failure, environment, content",
    [
        (Failure(FailureClass.NOT_LOGGED_IN, "x"), True, False),
        (Failure(FailureClass.RATE_LIMITED, "x"), True, False),
        (Failure(FailureClass.MODEL_UNAVAILABLE, "x"), True, False),
        (Failure(FailureClass.SANDBOX, "x"), True, False),
        (Failure(FailureClass.PROCESS_CRASHED, "launcher lost", environment=True), True, False),
        (Failure(FailureClass.ENGINE_ERROR, "x"), False, True),
        (Failure(FailureClass.PROCESS_CRASHED, "x"), False, True),
        (Failure(FailureClass.OUTPUT_TOO_LARGE, "x"), False, True),
        (Failure(FailureClass.REPLY_REFUSED, "x"), False, True),
        (Failure(FailureClass.STOPPED, "x"), False, False),
        (Failure(FailureClass.SESSION_INVALID, "x"), False, False),
    ],
)
def test_who_is_blamed(failure: Failure, environment: bool, content: bool) -> None:
    assert (blames_environment(failure), blames_content(failure)) == (environment, content)


def test_the_third_content_failure_on_the_oldest_message_sets_it_aside() -> None:
    retries = Retries(base_s=1)
    first = retries.failed(CRASH, frozenset({"m1", "m2", "m3"}))
    assert (first.retry_in_s, first.set_aside, retries.max_messages) == (1, False, 1)
    second = retries.failed(CRASH, frozenset({"m1"}))
    assert (second.retry_in_s, second.set_aside) == (2, False)
    third = retries.failed(CRASH, frozenset({"m1"}))
    assert (third.retry_in_s, third.set_aside) == (0, True)
    # Set aside: newer messages are claimed whole again, without delay.
    assert retries.max_messages is None and retries.failures == 0


def test_a_different_oldest_message_starts_counting_again() -> None:
    retries = Retries()
    retries.failed(CRASH, frozenset({"m1", "m2"}))
    retries.failed(CRASH, frozenset({"m1"}))
    # m1 was handled meanwhile (read elsewhere): m2 is the oldest now.
    step = retries.failed(CRASH, frozenset({"m2"}))
    assert not step.set_aside and retries.strikes == 1


def test_environment_failures_neither_strike_nor_narrow() -> None:
    retries = Retries()
    limited = Failure(FailureClass.RATE_LIMITED, "slow down")
    for _ in range(5):
        step = retries.failed(limited, frozenset({"m1"}))
        assert not step.set_aside
    assert retries.strikes == 0 and retries.max_messages is None
    assert step.retry_in_s == 80


def test_a_stop_is_not_retried_by_itself() -> None:
    step = Retries().failed(Failure(FailureClass.STOPPED, "stopped"), frozenset({"m1"}))
    assert step.retry_in_s is None and not step.set_aside


def _bash(
    command: str, *, exit_code: int | None = 0, failed: bool = False, output: str = ""
) -> EngineEvent:
    output = output or "Error: token expired\n"
    data = {"tool": "bash", "input": {"command": command}, "output": output}
    data["failed"] = failed
    facts = {"exit": exit_code} if exit_code is not None else None
    return EngineEvent("tool_use", AT, data, facts=facts)


@pytest.mark.parametrize(
    "events, refused",
    [
        ([], False),
        ([_bash("ls -la", exit_code=1)], False),
        ([_bash("crew reply r1 <<'EOF'\nhi\nEOF", exit_code=0)], False),
        ([_bash("crew reply r1 <<'EOF'\nhi\nEOF", exit_code=1)], True),
        ([_bash("cd work && crew reply r1 <<'EOF'\nhi\nEOF", exit_code=1)], True),
        ([_bash("crew reply r1 <<'EOF'\nhi\nEOF", exit_code=None, failed=True)], True),
        (
            [
                _bash("crew reply r1 <<'EOF'\nx\nEOF", exit_code=1),
                _bash("crew reply r1", exit_code=0),
            ],
            False,
        ),
        ([_bash("crew reply r1", exit_code=0), _bash("crew reply r2", exit_code=1)], True),
        # A refusal in one room is not cleared by a reply that got through in another.
        ([_bash("crew reply r2", exit_code=1), _bash("crew reply r1", exit_code=0)], True),
        (
            [_bash("crew reply r2 <<'EOF'", exit_code=1), _bash("crew reply r2<<EOF", exit_code=0)],
            False,
        ),
        (
            [
                _bash("crew reply --thread m1 r2 <<'EOF'", exit_code=1),
                _bash("crew reply r2 --thread m1 <<'EOF'", exit_code=0),
            ],
            False,
        ),
        ([_bash("crew replyish", exit_code=1), _bash("screw reply", exit_code=1)], False),
        # HELD, then nothing: the agent was told it may do nothing (issue 20).
        ([_bash("crew reply r1 <<'EOF'", exit_code=1, output=HELD_TEXT)], False),
        ([_bash("crew reply r1 <<'EOF'", exit_code=1, output="\n" + HELD_TEXT)], False),
        # HELD, then sent: answered. HELD in one room, refused in another: refused.
        (
            [
                _bash("crew reply r1 <<'EOF'", exit_code=1, output=HELD_TEXT),
                _bash("crew reply r1 <<'EOF'", exit_code=0),
            ],
            False,
        ),
        (
            [
                _bash("crew reply r1 <<'EOF'", exit_code=1, output=HELD_TEXT),
                _bash("crew reply r2 <<'EOF'", exit_code=1),
            ],
            True,
        ),
        # Refused, then HELD on the next try: the server took it, the agent may stop there.
        (
            [
                _bash("crew reply r1 <<'EOF'", exit_code=1),
                _bash("crew reply r1 <<'EOF'", exit_code=1, output=HELD_TEXT),
            ],
            False,
        ),
        # HELD, then refused on the resend: refused.
        (
            [
                _bash("crew reply r1 <<'EOF'", exit_code=1, output=HELD_TEXT),
                _bash("crew reply r1 <<'EOF'", exit_code=1),
            ],
            True,
        ),
        # Text that only mentions the HELD line further down is no HELD answer.
        ([_bash("crew reply r1", exit_code=1, output=f"Error: token expired\n{HELD_FIRST}")], True),
        ([_bash("crew read", exit_code=1)], False),
    ],
)
def test_a_refused_reply_is_the_last_crew_reply_failing(
    events: list[EngineEvent], refused: bool
) -> None:
    attempts = ReplyAttempts()
    for event in events:
        attempts.see(event)
    failure = attempts.failure()
    assert (failure is not None) == refused
    if failure is not None:
        assert failure.cls is FailureClass.REPLY_REFUSED
        assert "token expired" in failure.reason


def test_a_held_reply_is_remembered_as_held_not_as_answered() -> None:
    attempts = ReplyAttempts()
    attempts.see(_bash("crew reply r1 <<'EOF'", exit_code=1, output=HELD_TEXT))
    assert attempts.held == {"r1"} and attempts.refusals == {} and attempts.answered == set()
    assert not attempts.answered_all({"r1"})  # a failed turn is not acked as answered


@pytest.mark.parametrize(
    "failure, notice_reason",
    [
        (
            Failure(
                FailureClass.REPLY_REFUSED,
                "the agent's crew reply was refused and never got through (Error: x); "
                "the messages are kept",
            ),
            "reply_refused: the agent's crew reply was refused and never got through (Error: x)",
        ),
        (
            Failure(
                FailureClass.RESOURCE_LIMIT,
                "the turn used more memory than a turn may have, so it was ended; raise the "
                "limit if the agent's work needs more. The messages are kept.",
            ),
            "resource_limit: the turn used more memory than a turn may have, so it was ended; "
            "raise the limit if the agent's work needs more",
        ),
        (CRASH, "process_crashed: OpenCode was killed by signal 9"),
    ],
)
def test_a_set_aside_notice_never_says_the_messages_are_kept(
    failure: Failure, notice_reason: str
) -> None:
    assert set_aside_reason(failure) == notice_reason


def test_the_exit_status_of_a_bash_call_is_kept_as_a_fact_not_sent_upstream() -> None:
    line = {
        "type": "tool_use",
        "timestamp": 1796018935847,
        "part": {
            "type": "tool",
            "tool": "bash",
            "state": {
                "status": "completed",
                "input": {"command": "crew reply r1"},
                "output": "Error: token expired\n",
                "metadata": {"output": "Error: token expired\n", "exit": 1},
                "title": "crew reply r1",
            },
        },
    }
    event = engine_event_of(orjson.dumps(line))
    assert event.facts == {"exit": 1}
    assert "exit" not in orjson.dumps(event.as_upstream()).decode()


def test_a_rate_limit_with_the_providers_time_is_retried_then_not_after_5_s() -> None:
    retries = Retries()
    limited = Failure(FailureClass.RATE_LIMITED, "quota", retry_after_s=600.0)
    step = retries.failed(limited, frozenset({"m1"}))
    assert step.retry_in_s == 600.0 and not step.set_aside
    assert retries.strikes == 0 and retries.max_messages is None
    # Without a time of the provider's: the usual backoff (the count went on: 10 s).
    step = retries.failed(Failure(FailureClass.RATE_LIMITED, "slow down"), frozenset({"m1"}))
    assert step.retry_in_s == 10
    # A day at most, whatever a provider says.
    huge = Failure(FailureClass.RATE_LIMITED, "quota", retry_after_s=1e9)
    assert Retries().failed(huge, frozenset({"m1"})).retry_in_s == 24 * 3600
