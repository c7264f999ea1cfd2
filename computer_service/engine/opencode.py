"""`OpenCodeEngine`: one `opencode run` per turn, in the sandbox, through the launcher.

computer.md §3. The Computer computes everything the run needs — the exact
environment (nothing inherited), the derived OpenCode config, the user's
credentials — and hands the launcher a typed request; the launcher builds the
argv and the sandbox. Each stdout line becomes an event; the exit status, the
last `error` event and the stderr tail decide the failure class. A wall-clock
limit and a step guard end runaway turns; a vanished session is retried once
with a new one. `run_turn` never raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import anyio

from computer_service import safe_fs
from computer_service.engine.base import (
    EngineEvent,
    EventSink,
    Failure,
    FailureClass,
    SessionPlan,
    StopSignal,
    TurnRequest,
    TurnResult,
    Usage,
)
from computer_service.engine.events import ModelRequests, OutputCheck, engine_event_of
from computer_service.engine.failures import RunOutcome, classify, model_id_failure, redact
from computer_service.engine.loopback_ports import sandbox_loopback_ports
from computer_service.engine.opencode_env import engine_env, opencode_config
from computer_service.engine.user_opencode import (
    KEYLESS_PROVIDERS,
    NotLoggedIn,
    UserOpenCode,
    auth_for_provider,
    auth_secrets,
    config_secrets,
    read_auth,
    read_user_providers,
)
from computer_service.home import ENGINE_NAME, copy_price_table, plan_session, read_session_record
from computer_service.launcher_client import LauncherError, LauncherRefused, LauncherUnavailable
from computer_service.safe_fs import UnsafePath
from crew_common.launcher_wire import (
    DEFAULT_STDOUT_LIMIT,
    EngineArgs,
    ExitFrame,
    Frame,
    LineFrame,
    LogFrame,
    RunRequest,
    StartedFrame,
)
from crew_common.layout import AgentPaths

log = logging.getLogger(__name__)

TURN_TITLE = "crew turn"
# OpenCode's own retries wait 2 to 30 s; one that waits longer waits out a provider's
# Retry-After (uncapped: 600 s sat a turn until its wall clock): the turn ends as
# `rate_limited` then, retried at the provider's time (warm: `session.status` says it).
RETRY_PATIENCE_S = 30.0
# A cold run's log does not say how long the provider asked to wait, only that it is
# longer than OpenCode's own retries: the agent is tried again after this.
COLD_RATE_LIMIT_RETRY_S = 60.0
UNKNOWN_STEP_LIMIT = 3
# After asking the launcher to stop a run, how long to wait for its exit frame
# before dropping the connection (which makes the launcher kill the run).
END_GRACE_S = 10.0


class Launcher(Protocol):
    """What the engine needs of the launcher (`LauncherClient` satisfies it)."""

    def run(self, request: RunRequest) -> AsyncGenerator[Frame, None]: ...

    async def stop(self, run_id: str) -> None: ...


# ---- one run ----


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


class OpenCodeEngine:
    """The OpenCode engine (see module doc). Replace `launcher` when the launcher restarts."""

    name = ENGINE_NAME

    def __init__(
        self,
        launcher: Launcher,
        *,
        crew_home: Path,
        run_id: str,
        server_url: str,
        bin_dir: Path,
        interpreter_dirs: list[Path] | None = None,
        loopback_ports: list[int] | None = None,
        user: UserOpenCode | None = None,
        base_path: str | None = None,
        lang: str | None = None,
        stdout_limit: int = DEFAULT_STDOUT_LIMIT,
        end_grace_s: float = END_GRACE_S,
        environ: Mapping[str, str] | None = None,
        retry_patience_s: float = RETRY_PATIENCE_S,
    ) -> None:
        self.launcher = launcher
        self.crew_home = crew_home
        self.run_id = run_id
        self.server_url = server_url
        self.bin_dir = bin_dir
        self.interpreter_dirs = [str(p) for p in interpreter_dirs or []]
        self.loopback_ports = loopback_ports or []  # the bootstrap's extra forwarded ports
        self.user = user or UserOpenCode.from_env(os.environ)
        self.base_path = base_path if base_path is not None else os.environ.get("PATH", os.defpath)
        self.lang = lang or os.environ.get("LANG") or "C.UTF-8"
        self.stdout_limit = stdout_limit
        self.end_grace_s = end_grace_s
        self.retry_patience_s = retry_patience_s
        # Where `{env:VAR}` in the user's provider config is looked up (never passed on whole).
        self.environ = os.environ if environ is None else environ

    def paths(self, agent_id: str) -> AgentPaths:
        return AgentPaths(crew_home=self.crew_home, run_id=self.run_id, agent_id=agent_id)

    def plan_session(self, agent_id: str, model: str, agents_md: str) -> SessionPlan:
        """Continue the saved session when engine, model and AGENTS.md are unchanged."""
        record = read_session_record(self.paths(agent_id))
        return plan_session(record, self.name, model, agents_md)

    async def run_turn(
        self, request: TurnRequest, on_event: EventSink, stop: StopSignal
    ) -> TurnResult:
        """Run one turn (see module doc). Never raises, except cancellation."""
        paths = self.paths(request.agent_id)
        secrets = [str(paths.agent_dir), str(paths.runtime_dir), str(self.crew_home)]
        try:
            return await self._run_turn(request, on_event, stop, paths, secrets)
        except Exception as exc:
            log.exception("agent %s: the engine broke during a turn", request.agent_id)
            return crashed_result(exc, secrets)

    async def _run_turn(
        self,
        request: TurnRequest,
        on_event: EventSink,
        stop: StopSignal,
        paths: AgentPaths,
        secrets: list[str],
    ) -> TurnResult:
        prepared = await self.prepare(request, stop, paths, secrets)
        if isinstance(prepared, TurnResult):
            return prepared
        return await self.run_prepared(request, on_event, stop, paths, prepared, secrets)

    async def prepare(
        self, request: TurnRequest, stop: StopSignal, paths: AgentPaths, secrets: list[str]
    ) -> dict[str, str] | TurnResult:
        """The engine's whole environment for this turn, or the result that ends it early.

        Adds what must never show in a reason (credentials, the agent's token) to `secrets`.
        The warm engine starts its servers with exactly this environment.
        """
        if stop.is_set():
            return stopped_result(None, Usage())
        if (bad_model := model_id_failure(request.model)) is not None:
            return TurnResult("failed", bad_model)
        provider = request.model.split("/", 1)[0]
        # Resolved here: the engine gets none of our environment and none of the user's files.
        providers = await anyio.to_thread.run_sync(
            read_user_providers, self.user.config_files, self.environ
        )
        try:
            auth = await anyio.to_thread.run_sync(read_auth, self.user.auth_file)
        except NotLoggedIn as exc:
            # A provider the user configured (its key in the config or none needed) runs
            # without; so does one OpenCode runs keyless (`KEYLESS_PROVIDERS`).
            configured = providers is not None and provider in providers
            if not configured and provider not in KEYLESS_PROVIDERS:
                return TurnResult("failed", Failure(FailureClass.NOT_LOGGED_IN, str(exc)))
            auth = "{}"
        # Only the login of this turn's provider: the agent never sees the others.
        auth = auth_for_provider(auth, provider)
        secrets += auth_secrets(auth)
        if providers:
            secrets += config_secrets(providers)
        try:
            token = safe_fs.read_regular_file(self.crew_home, paths.token_file, 4096)
        except UnsafePath as exc:
            log.warning("agent %s: cannot read its token for redaction: %s", request.agent_id, exc)
            token = None
        if token:
            secrets.append(token.decode("utf-8", "replace").strip())
        await anyio.to_thread.run_sync(copy_price_table, paths, self.user.price_table)
        if stop.is_set():
            return stopped_result(None, Usage())
        return engine_env(
            paths,
            bin_dir=self.bin_dir,
            server_url=self.server_url,
            auth_content=auth,
            config_content=opencode_config(paths.agents_md, request.model, providers),
            base_path=self.base_path,
            lang=self.lang,
        )

    async def forwarded_ports(self) -> list[int]:
        """The host-loopback ports this Computer's sandboxes reach: crew server, local models."""
        providers = await anyio.to_thread.run_sync(
            read_user_providers, self.user.config_files, self.environ
        )
        return sandbox_loopback_ports(self.server_url, providers, self.loopback_ports)

    async def run_prepared(
        self,
        request: TurnRequest,
        on_event: EventSink,
        stop: StopSignal,
        paths: AgentPaths,
        env: dict[str, str],
        secrets: list[str],
    ) -> TurnResult:
        """Run the turn as one `opencode run` (again with a new session if the saved one vanished)."""
        env_ports = (env, await self.forwarded_ports())
        session_id = request.plan.session_id
        attempt = await self._attempt(request, paths, env_ports, session_id, on_event, stop)
        _, result = await again_if_the_session_vanished(
            request,
            attempt,
            lambda: self._attempt(request, paths, env_ports, None, on_event, stop),
            stop,
            secrets,
        )
        return result

    async def _attempt(
        self,
        request: TurnRequest,
        paths: AgentPaths,
        env_ports: tuple[dict[str, str], list[int]],
        session_id: str | None,
        on_event: EventSink,
        stop: StopSignal,
    ) -> Attempt:
        env, ports = env_ports
        run_id = str(uuid.uuid4())
        run = RunRequest(
            run_id=run_id,
            agent_id=request.agent_id,
            agent_dir=str(paths.agent_dir),
            runtime_dir=str(paths.runtime_dir),
            bin_dir=str(self.bin_dir),
            interpreter_dirs=self.interpreter_dirs,
            model=request.model,
            session_id=session_id,
            env=env,
            stdin=request.render_input(session_id is None),
            stdout_limit=self.stdout_limit,
            loopback_ports=ports,
            engine_args=EngineArgs(
                session_id=session_id,
                model=request.model,
                title=TURN_TITLE,
                dir=str(paths.work_dir),
            ),
        )
        a = Attempt()
        started = anyio.Event()
        read_scope = anyio.CancelScope()

        async def end_run(why: str) -> None:
            if a.ending is None:
                a.ending = why
            # The launcher only knows the run once it started it.
            with anyio.move_on_after(self.end_grace_s):
                await started.wait()
            try:
                await self.launcher.stop(run_id)
            except LauncherError as exc:
                log.warning("agent %s: stopping run %s failed: %s", request.agent_id, run_id, exc)
            await anyio.sleep(self.end_grace_s)
            read_scope.cancel()  # no exit frame in time: drop the stream, the launcher kills it

        async def watch_stop() -> None:
            await stop.wait()
            await end_run("stopped")

        async def watch_clock() -> None:
            await anyio.sleep(request.wall_clock_limit_s)
            a.time_limit_s = request.wall_clock_limit_s
            await end_run("timeout")

        async def watch_retry() -> None:
            # OpenCode waiting longer than its own retries: a provider's Retry-After.
            while a.requests.waiting_for(anyio.current_time()) <= self.retry_patience_s:
                await anyio.sleep(1.0)
            a.retry_after_s = COLD_RATE_LIMIT_RETRY_S
            a.guard_reason = a.requests.error
            await end_run("rate_limited")

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_stop)
            tg.start_soon(watch_clock)
            tg.start_soon(watch_retry)
            with read_scope:
                try:
                    # aclosing: leaving early (stop, guard, cancellation) closes the
                    # stream at once, which makes the launcher end the run.
                    async with contextlib.aclosing(self.launcher.run(run)) as frames:
                        async for frame in frames:
                            if isinstance(frame, LogFrame):
                                a.requests.see_log(frame.line, anyio.current_time())
                            elif isinstance(frame, LineFrame):
                                a.lines += 1
                                a.requests.progressed()
                                event = engine_event_of(frame.data)
                                finding = a.check.see(event)
                                guard = None
                                if finding is None:
                                    guard = a.track(event, request.max_steps)
                                await on_event(event)
                                if finding is not None:
                                    await self._unverified(a.check, finding, request, on_event)
                                if guard and a.ending is None:
                                    a.guard_reason = guard
                                    tg.start_soon(end_run, "guard")
                            elif isinstance(frame, StartedFrame):
                                started.set()
                            elif isinstance(frame, ExitFrame):
                                a.exit = frame
                except LauncherRefused as exc:
                    cls = FailureClass.SANDBOX
                    a.launcher_failure = Failure(cls, f"the sandbox refused the run: {exc}")
                except LauncherUnavailable as exc:
                    # The machine's fault, not the messages': retried, never set aside.
                    a.launcher_failure = Failure(
                        FailureClass.PROCESS_CRASHED,
                        f"the sandbox launcher was lost: {exc}",
                        environment=True,
                    )
                except LauncherError as exc:
                    a.launcher_failure = Failure(
                        FailureClass.PROCESS_CRASHED, f"the sandbox launcher misbehaved: {exc}"
                    )
            tg.cancel_scope.cancel()
        return a

    @staticmethod
    async def _unverified(
        check: OutputCheck, finding: str, request: TurnRequest, on_event: EventSink
    ) -> None:
        log.warning("agent %s: the engine's output held %s", request.agent_id, finding)
        marker = check.record(finding)
        if marker is not None:
            await on_event(marker)


AttemptT = TypeVar("AttemptT", bound=Attempt)


async def again_if_the_session_vanished(
    request: TurnRequest,
    first: AttemptT,
    with_new_session: Callable[[], Awaitable[AttemptT]],
    stop: StopSignal,
    secrets: list[str],
) -> tuple[AttemptT, TurnResult]:
    """The attempt and its result; if the saved session vanished, a second one with a new
    session (both engines: the usage of both attempts is counted)."""
    result = attempt_result(first, stop, secrets)
    if (
        request.plan.session_id is None
        or result.failure is None
        or result.failure.cls is not FailureClass.SESSION_INVALID
    ):
        return first, result
    log.info(
        "agent %s: session %s vanished; starting a new one",
        request.agent_id,
        request.plan.session_id,
    )
    second = await with_new_session()
    add_usage(second.usage, first.usage)
    return second, attempt_result(second, stop, secrets)


def attempt_result(a: Attempt, stop: StopSignal, secrets: list[str]) -> TurnResult:
    """How a turn ended, from what its engine process left behind (shared with the warm engine)."""
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
    """A turn the engine code itself broke on (shared with the warm engine): `process_crashed`."""
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
