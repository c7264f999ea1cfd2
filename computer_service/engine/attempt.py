"""One attempt at a turn: what it gathered and how it ended.

An attempt is one engine process's go at the turn (`opencode run`, or one
prompt on a warm server). `Attempt.track` accounts its events as they come
(session, usage, the step guard); `attempt_result` classifies how it ended,
the same for both ways, so usage, records and failure classes never depend
on how the turn ran.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from computer_service.engine.base import (
    EngineEvent,
    Failure,
    FailureClass,
    StopSignal,
    TurnResult,
    Usage,
)
from computer_service.engine.events import ModelRequests, OutputCheck
from computer_service.engine.failures import RunOutcome, classify, redact
from crew_common.launcher_wire import ExitFrame

# The title of the sessions a turn creates (`opencode run --title`, warm `POST /session`).
TURN_TITLE = "crew turn"
# OpenCode's own retries wait 2 to 30 s; one that waits longer waits out a provider's
# Retry-After (uncapped: 600 s sat a turn until its wall clock): the turn ends as
# `rate_limited` then, retried at the provider's time (warm: `session.status` says it).
RETRY_PATIENCE_S = 30.0
# A cold run's log does not say how long the provider asked to wait, only that it is
# longer than OpenCode's own retries: the agent is tried again after this.
COLD_RATE_LIMIT_RETRY_S = 60.0
UNKNOWN_STEP_LIMIT = 3


@dataclass
class Attempt:
    """What one engine process produced, gathered while its frames stream in."""

    session_id: str | None = None
    usage: Usage = field(default_factory=Usage)
    steps: int = 0
    unknown_streak: int = 0
    last_error: EngineEvent | None = None
    lines: int = 0
    exit: ExitFrame | None = None
    ending: str | None = None  # "stopped", "timeout" or "guard"
    guard_reason: str = ""
    time_limit_s: float = 0.0  # the wall-clock limit that ended it ("timeout")
    retry_after_s: float | None = None  # the provider's wait that ended it ("rate_limited")
    provider_time: bool = False  # `retry_after_s` is the provider's own (warm), not a guess
    launcher_failure: Failure | None = None
    check: OutputCheck = field(default_factory=OutputCheck)
    requests: ModelRequests = field(default_factory=ModelRequests)

    def track(self, event: EngineEvent, max_steps: int) -> str | None:
        """Account one event; return a guard reason when the turn must end."""
        if self.session_id is None and event.session_id:
            self.session_id = event.session_id
        if event.type == "step_start":
            self.steps += 1
            if self.steps > max_steps:
                return f"OpenCode ran more than {max_steps} steps in one turn; the turn was ended"
        elif event.type == "step_finish":
            tokens = event.data.get("tokens", {})
            u = self.usage
            u.input_tokens += tokens.get("input", 0)
            u.output_tokens += tokens.get("output", 0)
            u.reasoning_tokens += tokens.get("reasoning", 0)
            u.cache_read += tokens.get("cache_read", 0)
            u.cache_write += tokens.get("cache_write", 0)
            u.cost += event.data.get("cost", 0.0)
            if event.data.get("reason") == "unknown" and not any(tokens.values()):
                self.unknown_streak += 1
                if self.unknown_streak >= UNKNOWN_STEP_LIMIT:
                    return (
                        f"the model stream ended without a finish reason {UNKNOWN_STEP_LIMIT} "
                        "times in a row (zero tokens each); OpenCode would loop forever, so the "
                        "turn was ended. Check the model server."
                    )
            else:
                self.unknown_streak = 0
        elif event.type == "error":
            self.last_error = event
        return None


def attempt_result(a: Attempt, stop: StopSignal, secrets: list[str]) -> TurnResult:
    """How a turn ended, from what its engine process left behind (either way)."""
    # Stop and completion at the same moment count as stopped.
    if stop.is_set() or a.ending == "stopped":
        return stopped_result(a.session_id, a.usage)
    if a.ending == "timeout":
        failure = Failure(
            FailureClass.ENGINE_ERROR,
            f"the turn ran past its wall-clock limit ({_duration(a.time_limit_s)}) and "
            "was ended; the model may be hanging or retrying silently. A longer job needs "
            "a higher turn_time_limit_s: the agent's own (PATCH /api/agents/{id}) or the "
            "Computer's bootstrap",
        )
    elif a.ending == "rate_limited":
        wait = a.retry_after_s or 0.0
        said = f" ({a.guard_reason})" if a.guard_reason else ""
        if not a.provider_time:
            failure = Failure(
                FailureClass.RATE_LIMITED,
                f"the model provider is rate limiting requests{said}: OpenCode waits longer "
                f"than its own retries ({RETRY_PATIENCE_S:g} s) before the next one, as the "
                "provider asked (a cold run does not say how long); the turn was ended and "
                f"the agent tries again in {_duration(round(wait))}. The messages are kept.",
                retry_after_s=wait,
            )
        else:
            failure = _provider_wait(wait, said)
    elif a.ending == "guard":
        failure = Failure(FailureClass.ENGINE_ERROR, a.guard_reason)
    elif a.launcher_failure is not None:
        failure = a.launcher_failure
    elif a.exit is None:
        failure = Failure(FailureClass.PROCESS_CRASHED, "the run ended without an exit status")
    else:
        outcome = RunOutcome(
            exit_code=a.exit.code,
            signal=a.exit.signal,
            launcher_reason=a.exit.reason,
            last_error=a.last_error,
            stdout_empty=a.lines == 0,
            stderr_tail=a.exit.stderr_tail,
        )
        found = classify(outcome, secrets)
        if found is None:
            return TurnResult("succeeded", None, a.session_id, a.usage)
        if found.cls is FailureClass.STOPPED:
            return stopped_result(a.session_id, a.usage)
        failure = found
    failure = dataclasses.replace(failure, reason=redact(failure.reason, secrets))
    return TurnResult("failed", failure, a.session_id, a.usage)


def _provider_wait(wait: float, said: str) -> Failure:
    return Failure(
        FailureClass.RATE_LIMITED,
        f"the model provider is rate limiting requests{said} and asked to wait "
        f"{_duration(round(wait))} before the next one; the turn was ended and the agent "
        "tries again then. The messages are kept.",
        retry_after_s=wait,
    )


def _duration(seconds: float) -> str:
    """`30 min`, `90 s`: the limit as a person reads it."""
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return f"{seconds:g} s"


def crashed_result(exc: BaseException, secrets: list[str]) -> TurnResult:
    """A turn the engine code itself broke on: `process_crashed`."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    reason = redact(f"the engine failed unexpectedly: {type(exc).__name__}: {exc}", secrets)
    return TurnResult("failed", Failure(FailureClass.PROCESS_CRASHED, reason))


def stopped_result(session_id: str | None, usage: Usage) -> TurnResult:
    return TurnResult(
        "cancelled", Failure(FailureClass.STOPPED, "the turn was stopped"), session_id, usage
    )


def add_usage(total: Usage, more: Usage) -> None:
    total.input_tokens += more.input_tokens
    total.output_tokens += more.output_tokens
    total.reasoning_tokens += more.reasoning_tokens
    total.cache_read += more.cache_read
    total.cache_write += more.cache_write
    total.cost += more.cost
