"""The warm way: a turn's attempts on the agent's warm `opencode serve` (docs/warm-engine.md).

One of the two ways the pipeline (`pipeline.OpenCodeEngine`) runs a turn's
attempts, behind the same `Way` interface as the cold one: the server is
started with the turn's prepared environment (`preparation.PreparedTurn`),
sessions live in the same data directory under the same `session.json` rules,
and the server's events become exactly the lines `opencode run` prints
(`warm_events.run_line`), so the line parser, the usage and cost, the
records upstream and the failure classes are the cold way's
(`attempt.attempt_result`); one line more, `tool_start` when a tool begins to
run (`warm_events.ToolStarts`), which `opencode run` never prints. One turn:

1. the agent's server from the pool (`warm_pool`: started, or reused when the
   turn's environment is the one it started with); no server (no room, three
   failed starts) → the turn's attempts run the cold way, within what is
   left of the turn's limit;
2. open the instance's event stream; create a session (title and permissions
   as `run` sets them) unless the saved one is continued;
3. `prompt_async` with our own message id; events → lines → `EngineEvent`s;
   a `permission.asked` (an `ask` rule of the agent's policy) is put to the
   person as an approval card (`approvals.AskFlow`) and answered `once`,
   `always` or `reject` with the reason; the wall clock stands still meanwhile;
4. over by `TurnEnd`'s rule (never at the first idle of an error turn);
5. stop, wall-clock limit, step guard, output limit: abort the session,
   wait for its end; a server that does not end it is killed;
6. the launcher says whether the server's sandbox ran into a resource limit
   (it killed the server then, as it kills a cold run): the turn fails
   `resource_limit` as a cold one does, and the next turn gets a new server;
7. the launcher sweeps the server's namespace (nothing of the turn outlives it).

Everything the server says is untrusted: bounded event sizes, a heartbeat
deadline, defensive parsing. A server that breaks before the first prompt was
accepted is dropped and the turn runs cold; one that breaks during the turn
ends it as a crashed cold run would (`process_crashed`), unless the launcher
killed it at a resource limit (`resource_limit`, step 6).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import orjson

from computer_service import safe_fs
from computer_service.engine.approvals import (
    Asked,
    AskFlow,
    Decision,
    PersonClock,
    asked_of,
    refusal,
)
from computer_service.engine.attempt import RETRY_PATIENCE_S, TURN_TITLE, Attempt
from computer_service.engine.base import EventSink, Failure, FailureClass, StopSignal
from computer_service.engine.egress_events import denied_event
from computer_service.engine.events import engine_event_of
from computer_service.engine.pipeline import Attempts, Way
from computer_service.engine.preparation import PreparedTurn
from computer_service.engine.session import SESSION_ID
from computer_service.engine.warm_channel import NotTheServer
from computer_service.engine.warm_events import (
    MessageIds,
    SseFrames,
    ToolStarts,
    TurnEnd,
    retry_status,
    run_line,
    session_of,
)
from computer_service.engine.warm_pool import AgentServer, WarmPool
from computer_service.gateway.warm_up import WarmUpTwin
from crew_common.launcher_wire import EgressWire, ExitFrame, ServerRequest
from crew_common.layout import AgentPaths

log = logging.getLogger(__name__)

# The permissions `opencode run` gives the sessions it creates (its source).
RUN_PERMISSIONS = [
    {"permission": "question", "action": "deny", "pattern": "*"},
    {"permission": "plan_enter", "action": "deny", "pattern": "*"},
    {"permission": "plan_exit", "action": "deny", "pattern": "*"},
]
HEARTBEAT_TIMEOUT_S = 35.0  # the server beats every 10 s
CONNECTED_TIMEOUT_S = 15.0
ERROR_GRACE_S = 1.0  # an error turn without an assistant message: its second idle comes at once
ABORT_TIMEOUT_S = 5.0
# A cold fallback with less than this left of the turn's limit is not started.
MIN_COLD_LEFT_S = 5.0
# A prompt the server accepted shows in its session's events at once (busy, the user
# message); nothing of the session for this long: the prompt was dropped.
PROGRESS_TIMEOUT_S = 30.0
END_GRACE_S = 10.0
MAX_ANSWER_BYTES = 1024 * 1024
# A prewarm's warm-up (`warm_up`): bounded, and never worth more than the server's start.
WARM_UP_TIMEOUT_S = 30.0
WARM_UP_TITLE = "crew warm-up"


class ServerBroken(Exception):
    """The server answered something no working server would; it is dropped."""


@dataclass
class WarmAttempt(Attempt):
    """A cold attempt's account plus what only a warm turn can go through."""

    prompt_sent: bool = False
    broken: str | None = None  # why the server must be dropped
    bytes_out: int = 0
    error_texts: str = ""


class WarmRun(Way):
    """The warm way (module doc); `cold` runs the turns that get no server."""

    def __init__(
        self,
        cold: Way,
        pool: WarmPool,
        *,
        end_grace_s: float = END_GRACE_S,
        connected_timeout_s: float = CONNECTED_TIMEOUT_S,
        heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        progress_timeout_s: float = PROGRESS_TIMEOUT_S,
    ) -> None:
        self.cold = cold
        self.pool = pool
        self.end_grace_s = end_grace_s
        self.connected_timeout_s = connected_timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.progress_timeout_s = progress_timeout_s
        self._ids = MessageIds()

    @asynccontextmanager
    async def attempts(
        self, turn: PreparedTurn, on_event: EventSink, stop: StopSignal
    ) -> AsyncIterator[WarmTurn]:
        """The turn's attempts on the agent's server (step 1), or cold when it gets none.

        Leaving releases the server: swept for the next turn, or dropped when it broke.
        """
        request = turn.request
        extra_key = await _extra_key(turn)
        began = time.monotonic()
        server = await self.pool.acquire(
            request.agent_id,
            turn.asking_env(),
            lambda password: _server_request(turn, password),
            extra_key=extra_key,
            start_timeout_s=request.wall_clock_limit_s,
        )
        if server is not None:
            request.mark("server_ready")
        async with AsyncExitStack() as cold_stack:
            warm = WarmTurn(self, server, turn, on_event, stop, began, cold_stack)
            if server is None:
                await warm.go_cold()
            drop = True  # unless the turn got to its end with the server working
            try:
                yield warm
                if warm.server is not None:
                    # At the end of each turn: what its sandbox's firewall refused meanwhile.
                    for frame in await self.pool.denials(warm.server):
                        await on_event(denied_event(frame))
                    await self.pool.read_mcp(warm.server, request.capabilities)
                drop = warm.last is None or warm.last.broken is not None
                if warm.last is not None and warm.last.broken is not None:
                    log.warning(
                        "agent %s: dropping its warm server: %s", request.agent_id, warm.last.broken
                    )
            finally:
                if warm.server is not None:
                    with anyio.CancelScope(shield=True):
                        await self.pool.release(warm.server, broken=drop)

    async def prewarm(self, turn: PreparedTurn) -> str:
        """Start the agent's server for turns like `turn`, if it fits (`WarmPool.prewarm`)."""
        return await self.pool.prewarm(
            turn.request.agent_id,
            turn.asking_env(),
            lambda password: _server_request(turn, password),
            extra_key=await _extra_key(turn),
            warm_up=lambda server: warm_up(server, turn.request.model, turn.warm_up),
        )

    # ---- one attempt ----

    async def maintain(self) -> None:
        """For the Computer's life: stop idle servers; all of them at the end."""
        await self.pool.maintain()

    def health(self) -> dict[str, object] | None:
        return self.pool.health()

    def agent_status(self, agent_id: str) -> dict[str, object]:
        return self.pool.agent_status(agent_id)

    def metric_lines(self) -> list[str]:
        return self.pool.counters.lines()

    async def prompt(
        self,
        server: AgentServer,
        turn: PreparedTurn,
        session_id: str | None,
        on_event: EventSink,
        stop: StopSignal,
    ) -> WarmAttempt:
        """One prompt on `server` (steps 2 to 5); what broke is in the attempt."""
        a = WarmAttempt()
        try:
            await self._converse(server, turn, session_id, on_event, stop, a)
        except NotTheServer as exc:
            a.broken = str(exc)
            a.launcher_failure = Failure(FailureClass.PROCESS_CRASHED, str(exc), environment=True)
        except (httpx.HTTPError, ServerBroken, ValueError, TimeoutError) as exc:
            a.broken = f"{type(exc).__name__}: {exc}"
            a.launcher_failure = Failure(
                FailureClass.PROCESS_CRASHED,
                f"the warm OpenCode server failed during the turn ({a.broken})",
            )
        return a

    async def _converse(
        self,
        server: AgentServer,
        turn: PreparedTurn,
        session_id: str | None,
        on_event: EventSink,
        stop: StopSignal,
        a: WarmAttempt,
    ) -> None:
        request = turn.request
        client = server.client
        sse_timeout = httpx.Timeout(self.connected_timeout_s, read=None)
        async with client.stream("GET", "/event", timeout=sse_timeout) as sse:
            if sse.status_code != 200:
                raise ServerBroken(f"its event stream answered HTTP {sse.status_code}")
            events = _events(sse.aiter_raw())
            with anyio.fail_after(self.connected_timeout_s):
                first = await anext(events)
            if not isinstance(first, dict) or first.get("type") != "server.connected":
                raise ServerBroken("its event stream did not start with server.connected")
            new_session = session_id is None
            if session_id is None:
                session_id = await self._new_session(client)
            a.session_id = session_id
            message_id = self._ids.next()
            provider, _, model = request.model.partition("/")
            prompt = {
                "messageID": message_id,
                "parts": [{"type": "text", "text": request.render_input(new_session)}],
                "model": {"providerID": provider, "modelID": model},
            }
            request.mark("prompt_sent")
            status, _ = await _post(client, f"/session/{session_id}/prompt_async", prompt)
            if status == 404:
                # What `opencode run --session <gone>` says: classified `session_invalid`.
                a.exit = ExitFrame(t="exit", code=1, stderr_tail="Error: Session not found")
                return
            if status not in (200, 204):
                raise ServerBroken(f"it refused the prompt with HTTP {status}")
            a.prompt_sent = True
            request.mark("engine_accepted")
            await self._follow(server, turn, session_id, message_id, events, on_event, stop, a)

    async def _new_session(self, client: httpx.AsyncClient) -> str:
        status, content = await _post(
            client, "/session", {"title": TURN_TITLE, "permission": RUN_PERMISSIONS}
        )
        body = _json(content)
        session_id = body.get("id") if isinstance(body, dict) else None
        if status != 200 or not isinstance(session_id, str):
            raise ServerBroken(f"it did not create a session (HTTP {status})")
        if not SESSION_ID.fullmatch(session_id):
            raise ServerBroken("it answered a session id of an unexpected form")
        return session_id

    async def _follow(
        self,
        server: AgentServer,
        turn: PreparedTurn,
        session_id: str,
        message_id: str,
        events: AsyncIterator[Any],
        on_event: EventSink,
        stop: StopSignal,
        a: WarmAttempt,
    ) -> None:
        """Read the turn's events until it is over (or ended and not answering)."""
        request = turn.request
        end = TurnEnd(session_id, message_id)
        starts = ToolStarts()
        client = server.client
        read_scope = anyio.CancelScope()
        over = anyio.Event()

        async def end_turn(why: str) -> None:
            if a.ending is None:
                a.ending = why
            try:
                with anyio.fail_after(ABORT_TIMEOUT_S):
                    await _post(client, f"/session/{session_id}/abort", None)
            except (TimeoutError, httpx.HTTPError, NotTheServer) as exc:
                a.broken = f"it did not take the abort ({type(exc).__name__})"
                read_scope.cancel()
                return
            with anyio.move_on_after(self.end_grace_s):
                await over.wait()
                return
            a.broken = f"it did not end the turn within {self.end_grace_s:g} s of the abort"
            read_scope.cancel()

        async def watch_stop() -> None:
            await stop.wait()
            await end_turn("stopped")

        # The time a person takes to answer an ask does not count (approvals.PersonClock).
        clock = PersonClock()
        asks = AskFlow(request.approvals, on_event, clock)
        answered: set[str] = set()  # asks OpenCode closed itself (a reject closes them all)

        async def watch_clock() -> None:
            await clock.sleep_until_used(request.wall_clock_limit_s)
            a.time_limit_s = request.wall_clock_limit_s
            await end_turn("timeout")

        async def answer_permission(event: dict[str, Any]) -> None:
            asked = asked_of(event, session_id)
            if asked is None:
                return
            try:
                await answer_ask(asked)
            finally:
                asks.replied(asked.request_id)

        async def answer_ask(asked: Asked) -> None:
            if a.ending is not None:
                decision: Decision = refusal("the turn is ending")
            else:
                decision = await asks.decide(asked)
            if decision.reply == "reject":
                # Not before the others to be allowed got theirs: OpenCode rejects them too.
                await asks.before_reject(asked.request_id)
            if asked.request_id in answered:
                return
            try:
                status, _ = await _post(
                    client, f"/permission/{asked.request_id}/reply", decision.body()
                )
                # 404: OpenCode closed the ask itself meanwhile (an abort, another's reject).
                why = None if status in (200, 204, 404) else f"HTTP {status}"
            except (httpx.HTTPError, NotTheServer, ServerBroken) as exc:
                why = type(exc).__name__
            if why is None or asked.request_id in answered or a.ending is not None:
                return
            # The tool would wait for the answer until the wall clock: end the turn now.
            log.warning("agent %s: answering a permission failed: %s", request.agent_id, why)
            a.broken = f"it did not take the answer to a permission request ({why})"
            a.launcher_failure = Failure(
                FailureClass.PROCESS_CRASHED,
                f"the warm OpenCode server did not take the answer to a tool's permission "
                f"request ({why}); the turn was ended and the server is replaced",
                environment=True,
            )
            await end_turn("broken")

        progressed = anyio.Event()

        async def watch_progress() -> None:
            with anyio.move_on_after(self.progress_timeout_s):
                await progressed.wait()
                return
            if a.ending is not None:
                return
            a.broken = f"nothing of the session in {self.progress_timeout_s:g} s after the prompt"
            a.launcher_failure = Failure(
                FailureClass.PROCESS_CRASHED,
                "the warm OpenCode server took the prompt but never started on it "
                f"({self.progress_timeout_s:g} s); the turn was ended and the server is replaced",
                environment=True,
            )
            await end_turn("broken")

        def rate_limited(at_ms: float, message: str) -> None:
            wait_s = max(0.0, at_ms / 1000 - time.time())
            if wait_s <= RETRY_PATIENCE_S or a.ending is not None:
                return
            a.retry_after_s = wait_s
            a.provider_time = True
            a.guard_reason = message
            tg.start_soon(end_turn, "rate_limited")

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_stop)
            tg.start_soon(watch_clock)
            tg.start_soon(watch_progress)
            with read_scope:
                grace_until: float | None = None
                while not end.over:
                    wait = self.heartbeat_timeout_s
                    if grace_until is not None:
                        wait = max(0.0, grace_until - anyio.current_time())
                    with anyio.move_on_after(wait) as waited:
                        try:
                            event = await anext(events)
                        # A server that dies mid-answer (killed at a resource limit, say)
                        # cuts its chunked stream short: the same as the stream ending.
                        except (StopAsyncIteration, httpx.TransportError) as exc:
                            a.broken = a.broken or (
                                f"its event stream ended during the turn ({_why(exc)})"
                            )
                            a.launcher_failure = a.launcher_failure or Failure(
                                FailureClass.PROCESS_CRASHED,
                                "the warm OpenCode server went away during the turn",
                            )
                            break
                    if waited.cancelled_caught:
                        if grace_until is not None:
                            break  # an error turn with no assistant message: over
                        a.broken = a.broken or f"it sent nothing for {self.heartbeat_timeout_s:g} s"
                        a.launcher_failure = a.launcher_failure or Failure(
                            FailureClass.PROCESS_CRASHED,
                            "the warm OpenCode server stopped answering",
                        )
                        break
                    if session_of(event) == session_id:
                        progressed.set()
                    if isinstance(event, dict) and event.get("type") == "permission.asked":
                        tg.start_soon(answer_permission, event)
                    if (replied := _replied(event, session_id)) is not None:
                        answered.add(replied)
                    if (retry := retry_status(event, session_id)) is not None:
                        rate_limited(*retry)
                    now_ms = int(time.time() * 1000)
                    line = run_line(event, session_id, now_ms) or starts.line(
                        event, session_id, now_ms
                    )
                    if line is not None:
                        await self._line(line, turn, a, on_event, tg, end_turn)
                    end.see(event)
                    if end.error_idle and grace_until is None:
                        grace_until = anyio.current_time() + ERROR_GRACE_S
            over.set()
            tg.cancel_scope.cancel()
        if a.launcher_failure is None and a.broken is None:
            a.exit = ExitFrame(
                t="exit",
                code=1 if a.last_error is not None else 0,
                stderr_tail=a.error_texts,
                reason="output_too_large" if a.ending == "output" else None,
            )
        elif a.launcher_failure is None:
            a.launcher_failure = Failure(
                FailureClass.PROCESS_CRASHED, f"the warm OpenCode server failed: {a.broken}"
            )

    async def _line(
        self,
        line: dict[str, Any],
        turn: PreparedTurn,
        a: WarmAttempt,
        on_event: EventSink,
        tg: anyio.abc.TaskGroup,
        end_turn: Any,
    ) -> None:
        if a.ending is not None:
            # Ended by us (stop, limit, guard): a cold run is killed then and prints nothing more.
            return
        encoded = orjson.dumps(line)
        a.bytes_out += len(encoded) + 1
        if a.bytes_out > turn.stdout_limit:
            a.ending = "output"  # at once: no line after this one is reported
            tg.start_soon(end_turn, "output")
            return  # over the cap: nothing more is reported, as with a cold run
        a.lines += 1
        event = engine_event_of(encoded)
        if event.type == "error":
            # A cold run's log (stderr) names what its `error` line only hints at
            # (`Model not found: …`); here the event itself carries it.
            a.error_texts = (a.error_texts + "\n" + str(event.data.get("message", "")))[-4096:]
        guard = a.track(event, turn.request.max_steps)
        await on_event(event)
        if guard and a.ending is None:
            a.guard_reason = guard
            a.ending = "guard"
            tg.start_soon(end_turn, "guard")


class WarmTurn:
    """The attempts of one warm turn: on the agent's server, or cold once it has none."""

    def __init__(
        self,
        way: WarmRun,
        server: AgentServer | None,
        turn: PreparedTurn,
        on_event: EventSink,
        stop: StopSignal,
        began: float,
        cold_stack: AsyncExitStack,
    ) -> None:
        self.way = way
        self.server = server  # None: the turn runs cold (the server was released)
        self.turn = turn
        self.on_event = on_event
        self.stop = stop
        self.began = began
        self.last: WarmAttempt | None = None  # the last attempt on the server
        self._cold: Attempts | None = None
        self._cold_stack = cold_stack

    async def attempt_in(self, session_id: str | None) -> Attempt:
        """On the server; a server that broke before it took the first prompt: cold."""
        if self._cold is not None:
            return await self._cold.attempt_in(session_id)
        assert self.server is not None
        first = self.last is None
        a = await self.way.prompt(self.server, self.turn, session_id, self.on_event, self.stop)
        if first and not a.prompt_sent and a.broken is not None:
            log.warning(
                "agent %s: its warm server broke before the turn (%s); running it cold",
                self.turn.request.agent_id,
                a.broken,
            )
            server, self.server = self.server, None
            await self.way.pool.release(server, broken=True)
            return await (await self.go_cold()).attempt_in(session_id)
        if first:
            self.way.pool.counters.warm_turns += 1
        self.last = a
        return a

    async def settle(self, last: Attempt) -> bool:
        """Did the turn's sandbox hit a resource limit (step 6)? Then `last` ends as a cold
        run at it."""
        if self._cold is not None:
            return await self._cold.settle(last)
        assert self.server is not None and isinstance(last, WarmAttempt)
        hit = await self.way.pool.limit_hit(self.server)
        if hit is None:
            return False
        log.warning("agent %s: its warm turn hit a resource limit (%s)", self.server.agent_id, hit)
        end_at_limit(last, hit)
        return True

    async def go_cold(self) -> Attempts:
        """The turn's attempts from now on: cold, within what is left of its limit (issue 20:
        a server that never started cost the turn's limit plus the launcher's 60 s)."""
        request = self.turn.request
        left = request.wall_clock_limit_s - (time.monotonic() - self.began)
        if left < MIN_COLD_LEFT_S:
            self._cold = NoTimeLeft(request.wall_clock_limit_s)
            return self._cold
        self.way.pool.counters.cold_turns += 1
        turn = dataclasses.replace(
            self.turn, request=dataclasses.replace(request, wall_clock_limit_s=left)
        )
        self._cold = await self._cold_stack.enter_async_context(
            self.way.cold.attempts(turn, self.on_event, self.stop)
        )
        return self._cold


@dataclass
class NoTimeLeft:
    """A turn whose server took (nearly) its whole limit to fail: no cold run is started."""

    limit_s: float

    async def attempt_in(self, session_id: str | None) -> Attempt:
        return Attempt(
            launcher_failure=Failure(
                FailureClass.PROCESS_CRASHED,
                "the agent's warm OpenCode server did not start within the turn's "
                f"wall-clock limit ({self.limit_s:g} s); the turn is tried "
                "again (cold after three failed starts). The messages are kept.",
                environment=True,
            )
        )

    async def settle(self, last: Attempt) -> bool:
        return False


async def _extra_key(turn: PreparedTurn) -> bytes:
    """What a server keeps from its start besides its environment: a new AGENTS.md,
    forwarded ports, directories made anew or another egress policy need a new server
    (its sandbox's firewall is set once, at its start)."""
    agents_md = await anyio.to_thread.run_sync(_agents_md, turn.paths)
    directories = await anyio.to_thread.run_sync(_directories, turn.paths)
    return agents_md + repr(turn.ports).encode() + directories + orjson.dumps(turn.egress.as_wire())


async def warm_up(server: AgentServer, model: str, twin: WarmUpTwin | None = None) -> bool:
    """Boot on a fresh server what its first prompt would, without reaching the provider.

    OpenCode 1.18.33 boots lazily: after `serve` listens, the first prompt still loads
    the directory's instance, the providers and the model (1.5 to 2 s before its model
    request on a fresh server, 2 CPUs under load), and only a model call reaches the
    rest (the prompt loop, the tool registry, the SDK's first stream). With a `twin`
    (the turn's provider has one: `gateway.warm_up`) the warm-up is a real prompt to the
    twin's model, which the agent's gateway answers itself with a canned stream while
    the gate is open: no request reaches the user's provider, no token is spent.
    Without, a message with `noReply: true` goes through the path up to storing the
    user message, and stops there. Either is sent in a throwaway session, deleted
    afterwards, so no turn's conversation holds it. → whether it went through; never
    raises (logged).
    """
    client = server.client
    provider, _, model_id = (twin.model if twin is not None else model).partition("/")
    began = time.monotonic()
    try:
        with anyio.fail_after(WARM_UP_TIMEOUT_S):
            status, content = await _post(
                client, "/session", {"title": WARM_UP_TITLE, "permission": RUN_PERMISSIONS}
            )
            body = _json(content)
            session_id = body.get("id") if isinstance(body, dict) else None
            if (
                status != 200
                or not isinstance(session_id, str)
                or not SESSION_ID.fullmatch(session_id)
            ):
                log.info("agent %s: no warm-up (a session: HTTP %s)", server.agent_id, status)
                return False
            message: dict[str, Any] = {
                "parts": [{"type": "text", "text": WARM_UP_TITLE}],
                "model": {"providerID": provider, "modelID": model_id},
            }
            try:
                if twin is None:
                    message["noReply"] = True
                    status, content = await _post(client, f"/session/{session_id}/message", message)
                else:
                    with twin.gate.open():
                        status, content = await _post(
                            client, f"/session/{session_id}/message", message
                        )
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    answer = await client.delete(f"/session/{session_id}")
                    if answer.status_code != 200:
                        log.info(
                            "agent %s: the warm-up session stays (HTTP %s)",
                            server.agent_id,
                            answer.status_code,
                        )
            ok = status in (200, 204) and not _failed_reply(content)
            if not ok:
                log.info("agent %s: the warm-up was refused (HTTP %s)", server.agent_id, status)
            else:
                log.info(
                    "agent %s: its server was warmed up in %.2f s (%s)",
                    server.agent_id,
                    time.monotonic() - began,
                    "a model call answered by the gateway" if twin is not None else "no model call",
                )
            return ok
    except (httpx.HTTPError, ServerBroken, NotTheServer, TimeoutError, ValueError) as exc:
        log.warning(
            "agent %s: the warm-up failed: %s: %s", server.agent_id, type(exc).__name__, exc
        )
        return False


def _failed_reply(content: bytes) -> bool:
    """Did the warm-up's answer (an assistant message) carry an error?"""
    body = _json(content) if content else None
    info = body.get("info") if isinstance(body, dict) else None
    return isinstance(info, dict) and info.get("error") is not None


def _server_request(turn: PreparedTurn, password: str) -> ServerRequest:
    paths = turn.paths
    return ServerRequest(
        agent_id=paths.agent_id,
        agent_dir=str(paths.agent_dir),
        runtime_dir=str(paths.runtime_dir),
        bin_dir=str(turn.bin_dir),
        interpreter_dirs=turn.interpreter_dirs,
        env={**turn.asking_env(), "OPENCODE_SERVER_PASSWORD": password},
        loopback_ports=turn.ports,
        egress=EgressWire.of(turn.egress),
    )


def end_at_limit(a: WarmAttempt, hit: str) -> None:
    """The attempt as a cold run the launcher ended at limit `hit` (`process_limit`, …).

    The launcher killed the server at the hit: whatever the turn's stream showed
    afterwards (its end, a crash, even a finished answer) is a cold run's kill,
    whose exit frame names the limit. A reason already there (output over the
    cap) came first and stays, as the launcher keeps a run's first reason.
    `attempt_result` then classifies it as it does the cold run's.
    """
    a.broken = a.broken or f"its sandbox hit a resource limit ({hit})"
    a.launcher_failure = None
    if a.exit is None or a.exit.reason is None:
        a.exit = ExitFrame(t="exit", code=None, signal=9, stderr_tail=a.error_texts, reason=hit)


def _replied(event: Any, session_id: str) -> str | None:
    """The request a `permission.replied` of the session closed (ours, or OpenCode's own)."""
    if not isinstance(event, dict) or event.get("type") != "permission.replied":
        return None
    props = event.get("properties")
    if not isinstance(props, dict) or props.get("sessionID") != session_id:
        return None
    request_id = props.get("requestID")
    return request_id if isinstance(request_id, str) else None


def _why(exc: BaseException) -> str:
    return "closed" if isinstance(exc, StopAsyncIteration) else type(exc).__name__


def _agents_md(paths: AgentPaths) -> bytes:
    try:
        return safe_fs.read_regular_file(paths.crew_home, paths.agents_md, 1024 * 1024) or b""
    except safe_fs.UnsafePath as exc:
        log.warning("agent %s: cannot read AGENTS.md: %s", paths.agent_id, exc)
        return b""


def _directories(paths: AgentPaths) -> bytes:
    """Which directories the agent has: a server keeps the ones it started in.

    The sandbox binds directories, not names: once the Computer made an agent's
    directories anew (they had been replaced, e.g. by links: `home.py`), a
    server started before still works in the old ones. Their identities are
    part of the server's key, so such a server is replaced.
    """
    found = []
    for path in (paths.agent_dir, paths.work_dir, paths.engine_dir, paths.data_dir):
        try:
            st = path.lstat()
        except OSError:
            found.append("-")
            continue
        found.append(f"{st.st_dev}:{st.st_ino}")
    return " ".join(found).encode()


async def _events(chunks: AsyncIterator[bytes]) -> AsyncIterator[Any]:
    frames = SseFrames()
    async for chunk in chunks:
        for event in frames.feed(chunk):
            yield event


async def _post(client: httpx.AsyncClient, path: str, body: Any) -> tuple[int, bytes]:
    """POST to the server; its status and at most `MAX_ANSWER_BYTES` of its answer (else broken)."""
    content = b""
    async with client.stream("POST", path, json=body) as answer:
        async for chunk in answer.aiter_bytes():
            content += chunk
            if len(content) > MAX_ANSWER_BYTES:
                raise ServerBroken(f"it answered over {MAX_ANSWER_BYTES} bytes")
        return answer.status_code, content


def _json(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
