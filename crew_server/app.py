"""The reference crew server's HTTP API (Starlette): computer, agent and user endpoints.

`create_app(store, clock, dev)` builds it; tests drive it in-process through
`httpx.ASGITransport`, `crew-server` serves it with uvicorn. The routes are
listed at the bottom, grouped by who calls them.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import orjson
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from crew_server import models as m
from crew_server import rules
from crew_server.clock import Clock, iso
from crew_server.errors import (
    ApiError,
    BadJson,
    Conflict,
    Invalid,
    NotFound,
    Refused,
    TooLarge,
    Unauthorized,
)
from crew_server.store import USER, Actor, AgentIdentity, Store

log = logging.getLogger("crew_server.app")

MAX_BODY = 1024 * 1024
PING_SECONDS = 15.0
M = TypeVar("M", bound=BaseModel)
Handler = Callable[[Request], Awaitable[Response]]


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """An orjson-encoded JSON answer."""
    return Response(
        orjson.dumps(data), status_code=status, media_type="application/json", headers=headers
    )


def no_content() -> Response:
    """204."""
    return Response(status_code=204)


class EventHub:
    """Wakes the SSE streams of a Computer when the store committed events for it."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    def close(self) -> None:
        """The server is stopping: end every stream (they would hold the shutdown forever).

        Safe to call from a signal handler or another thread.
        """
        self.closed = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._set, set(self._waiting))

    def subscribe(self, computer_id: str) -> asyncio.Event:
        """A flag set whenever this Computer gets new events."""
        self._loop = asyncio.get_running_loop()
        flag = asyncio.Event()
        self._waiting.setdefault(computer_id, set()).add(flag)
        return flag

    def unsubscribe(self, computer_id: str, flag: asyncio.Event) -> None:
        """Forget a stream's flag (the stream ended)."""
        flags = self._waiting.get(computer_id)
        if flags is not None:
            flags.discard(flag)
            if not flags:
                del self._waiting[computer_id]

    def notify(self, computer_ids: set[str]) -> None:
        """Called by the store after a commit, possibly from another thread."""
        loop = self._loop
        if loop is None:
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._set(computer_ids)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._set, computer_ids)

    def _set(self, computer_ids: set[str]) -> None:
        for computer_id in computer_ids:
            for flag in self._waiting.get(computer_id, ()):
                flag.set()


class ReminderScheduler:
    """Fires due reminders: sleeps until the next one is due, or until poked."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self._poke: asyncio.Event | None = None

    def poke(self) -> None:
        """Reminders changed (or the clock moved): look again now."""
        if self._poke is not None:
            self._poke.set()

    def run_due(self) -> int:
        """Fire what is due now; a failure is logged and retried on the next round."""
        try:
            return self.store.fire_due_reminders()
        except Exception:
            log.exception("firing due reminders failed; will retry")
            return 0

    async def run(self) -> None:
        """Fire due reminders until cancelled (the app's lifespan owns this task)."""
        self._poke = asyncio.Event()
        while True:
            self._poke.clear()
            self.run_due()
            delay = 60.0
            try:
                following = self.store.next_reminder_at()
            except Exception:
                log.exception("reading the next reminder time failed; will retry")
                following = None
            if following is not None:
                delay = min(delay, max(0.0, (following - self.clock.now()).total_seconds()))
            with anyio.move_on_after(delay):
                await self._poke.wait()


async def read_body(request: Request, model: type[M]) -> M:
    """The request's JSON body validated by `model`; 413 over 1 MiB, 400/422 when bad."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadJson("the Content-Length header is not a number")
        if int(declared) > MAX_BODY:
            raise TooLarge("the request body is over 1 MiB; send less")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise TooLarge("the request body is over 1 MiB; send less")
    try:
        return model.model_validate_json(bytes(raw) if raw.strip() else b"{}")
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if any(err["type"] == "json_invalid" for err in errors):
            raise BadJson(
                f"the request body is not valid JSON ({errors[0]['msg']}); send a JSON object"
            ) from exc
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in errors[:5]
        )
        raise Invalid(f"the request body is invalid: {problems}") from exc


def bearer(request: Request) -> str:
    """The bearer token of the request; Unauthorized when there is none."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token; send Authorization: Bearer <token>")
    return token.strip()


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter within [low, high]; 422 otherwise."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise Invalid(f"query parameter {name} must be an integer") from exc
    if not low <= value <= high:
        raise Invalid(f"query parameter {name} must be between {low} and {high}")
    return value


def route(path: str, query: tuple[str, ...] = (), **handlers: Handler) -> Route:
    """One route per path, dispatching on the method, so a 405 lists every allowed method.

    Query parameters other than `query` are refused: a typo must not pass silently.
    """

    async def endpoint(request: Request) -> Response:
        unknown = sorted(set(request.query_params) - set(query))
        if unknown:
            allowed = ", ".join(query) or "none"
            raise Invalid(f"unknown query parameter {unknown[0]!r}; this endpoint takes: {allowed}")
        method = "GET" if request.method == "HEAD" else request.method
        return await handlers[method](request)

    return Route(path, endpoint, methods=list(handlers))


_UUID_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)


def uuid_param(request: Request, name: str) -> str | None:
    """An optional UUID query parameter; 422 when present but not a UUID."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    if not _UUID_RE.match(raw):
        raise Invalid(f"query parameter {name} must be a UUID")
    return raw


def create_app(
    store: Store,
    clock: Clock,
    dev: bool = False,
    *,
    ping_seconds: float = PING_SECONDS,
    run_scheduler: bool = True,
) -> Starlette:
    """The ASGI app. `dev` turns user auth off and enables `POST /api/dev/clock`."""
    hub = EventHub()
    store.listener = hub.notify
    scheduler = ReminderScheduler(store, clock)

    # ------------------------------------------------------------ who is calling

    def user(request: Request) -> Actor:
        if not dev and not store.check_user_token(bearer(request)):
            raise Unauthorized("the user token is not valid; use the token printed at first start")
        return USER

    def computer(request: Request) -> str:
        return store.computer_by_token(bearer(request))

    def agent(request: Request) -> AgentIdentity:
        return store.agent_by_token(bearer(request))

    def agent_actor(identity: AgentIdentity) -> Actor:
        return Actor("agent", identity.agent_id, identity.handle)

    def task_number(request: Request) -> int:
        raw = request.path_params["number"]
        if not (raw.isascii() and raw.isdigit()):
            raise Invalid("the task number must be a positive integer, like 3")
        number = int(raw)
        if not 1 <= number < 2**53:
            raise NotFound(f"no task #{raw}")
        return number

    # ------------------------------------------------------------ public

    async def health(request: Request) -> Response:
        return json_response({"ok": True})

    # ------------------------------------------------------------ user API

    async def post_computer(request: Request) -> Response:
        user(request)
        body = await read_body(request, m.ComputerCreate)
        computer_id, token = store.create_computer(body.name)
        return json_response({"computer_id": computer_id, "token": token}, 201)

    async def get_computers(request: Request) -> Response:
        user(request)
        return json_response(store.list_computers())

    async def post_agent(request: Request) -> Response:
        user(request)
        body = await read_body(request, m.AgentCreate)
        created = store.create_agent(
            body.handle, body.name, body.persona, body.model, body.engine, body.computer_id
        )
        return json_response(created, 201)

    async def patch_agent(request: Request) -> Response:
        user(request)
        body = await read_body(request, m.AgentPatch)
        # null means "no change", except computer_id: null takes the agent off its Computer
        changes = {
            k: v
            for k, v in body.model_dump(exclude_unset=True).items()
            if v is not None or k == "computer_id"
        }
        return json_response(store.update_agent(request.path_params["agent_id"], changes))

    async def get_agents(request: Request) -> Response:
        user(request)
        return json_response(store.list_agents())

    async def get_positions(request: Request) -> Response:
        user(request)
        return json_response(store.positions(request.path_params["agent_id"]))

    async def delete_user_mute(request: Request) -> Response:
        user(request)
        store.unmute(request.path_params["agent_id"], request.path_params["room_id"])
        return no_content()

    async def post_room(request: Request) -> Response:
        user(request)
        body = await read_body(request, m.RoomCreate)
        room, created = store.create_room(body.kind, body.title, body.agent_ids)
        return json_response(room, 201 if created else 200)

    async def get_rooms(request: Request) -> Response:
        user(request)
        return json_response(store.list_rooms())

    async def get_room(request: Request) -> Response:
        user(request)
        return json_response(store.get_room(request.path_params["room_id"]))

    async def post_message(request: Request) -> Response:
        user(request)
        body = await read_body(request, m.MessageCreate)
        message = store.user_post(request.path_params["room_id"], body.body, body.thread_of)
        return json_response(message, 201)

    async def get_messages(request: Request) -> Response:
        user(request)
        after = int_param(request, "after_seq", 0, 0, 2**53)
        limit = int_param(request, "limit", 500, 1, 1000)
        return json_response(store.list_messages(request.path_params["room_id"], after, limit))

    async def get_turns(request: Request) -> Response:
        user(request)
        limit = int_param(request, "limit", 100, 1, 1000)
        return json_response(store.list_turns(uuid_param(request, "agent_id"), limit))

    async def get_turn(request: Request) -> Response:
        user(request)
        return json_response(store.get_turn(request.path_params["turn_id"]))

    async def get_user_tasks(request: Request) -> Response:
        actor = user(request)
        return json_response(store.list_tasks(actor, uuid_param(request, "room_id")))

    async def post_user_task(request: Request) -> Response:
        actor = user(request)
        body = await read_body(request, m.TaskCreate)
        return json_response(store.create_task(actor, body.room_id, body.title, body.assignee), 201)

    async def post_user_convert(request: Request) -> Response:
        actor = user(request)
        body = await read_body(request, m.TaskConvert)
        return json_response(store.convert_task(actor, body.message_id, body.assignee), 201)

    async def post_user_status(request: Request) -> Response:
        actor = user(request)
        body = await read_body(request, m.TaskStatusSet)
        return json_response(
            store.set_task_status(actor, task_number(request), body.status, body.note, body.room_id)
        )

    async def post_user_assign(request: Request) -> Response:
        actor = user(request)
        body = await read_body(request, m.TaskAssign)
        return json_response(
            store.assign_task(actor, task_number(request), body.assignee, body.room_id)
        )

    async def post_dev_clock(request: Request) -> Response:
        user(request)
        if not dev:
            raise NotFound("the clock hook exists only on a server started with --dev")
        body = await read_body(request, m.DevClock)
        try:
            now = clock.advance(body.advance_seconds)
        except (ValueError, OverflowError) as exc:
            raise Refused(str(exc)) from exc
        fired = scheduler.run_due()
        scheduler.poke()
        return json_response({"now": iso(now), "fired": fired})

    # ------------------------------------------------------------ computer API

    async def post_connect(request: Request) -> Response:
        computer_id = computer(request)
        body = await read_body(request, m.Connect)
        return json_response(
            store.connect(computer_id, body.hostname, body.platform, body.version, body.capacity)
        )

    async def get_computer_agents(request: Request) -> Response:
        return json_response(store.computer_agents(computer(request)))

    async def put_models(request: Request) -> Response:
        computer_id = computer(request)
        body = await read_body(request, m.ModelsPut)
        store.set_models(computer_id, body.models)
        return no_content()

    async def put_problem(request: Request) -> Response:
        computer_id = computer(request)
        body = await read_body(request, m.ProblemPut)
        store.set_problem(computer_id, request.path_params["agent_id"], body.reason)
        return no_content()

    async def delete_problem(request: Request) -> Response:
        store.set_problem(computer(request), request.path_params["agent_id"], None)
        return no_content()

    async def post_agent_token(request: Request) -> Response:
        token = store.issue_agent_token(computer(request), request.path_params["agent_id"])
        return json_response({"token": token})

    async def post_unread(request: Request) -> Response:
        rooms, more = store.claim_unread(computer(request), request.path_params["agent_id"])
        return json_response({"rooms": rooms, "more": more})

    async def post_turn(request: Request) -> Response:
        computer_id = computer(request)
        body = await read_body(request, m.TurnRegister)
        registered = store.register_turn(
            computer_id,
            request.path_params["agent_id"],
            [r.model_dump() for r in body.rooms],
            body.input,
            body.engine,
            body.model,
            body.session_id,
        )
        return json_response(registered, 201)

    async def post_events(request: Request) -> Response:
        computer_id = computer(request)
        body = await read_body(request, m.EventsBatch)
        for offset, item in enumerate(body.events):
            if item.index is not None and item.index != body.first_index + offset:
                raise Conflict(
                    f"event {offset} has index {item.index} but first_index makes it "
                    f"{body.first_index + offset}; number events from first_index"
                )
        events = []
        for offset, item in enumerate(body.events):
            try:
                data = orjson.dumps(item.data).decode()
            except orjson.JSONEncodeError as exc:  # e.g. an integer beyond 64 bits
                raise Invalid(f"events.{offset}.data cannot be stored: {exc}") from exc
            events.append({"type": item.type, "at": iso(item.at), "data_json": data})
        store.add_events(
            computer_id, request.path_params["turn_id"], body.fence, body.first_index, events
        )
        return no_content()

    async def post_finish(request: Request) -> Response:
        computer_id = computer(request)
        body = await read_body(request, m.TurnFinish)
        store.finish_turn(
            computer_id,
            request.path_params["turn_id"],
            body.fence,
            body.status,
            body.failure.model_dump(by_alias=True) if body.failure else None,
            body.usage.model_dump() if body.usage else None,
        )
        return no_content()

    async def post_ack(request: Request) -> Response:
        computer_id = computer(request)
        body = await read_body(request, m.Ack)
        store.ack(computer_id, request.path_params["agent_id"], body.turn_id, body.fence)
        return no_content()

    async def get_events(request: Request) -> Response:
        computer_id = computer(request)
        raw = (request.headers.get("last-event-id") or "").strip()
        if raw and not (raw.isascii() and raw.isdigit()):
            raise Invalid("Last-Event-ID must be an id this server sent (an integer)")
        # An id from before a database reset would hide every new event: start afresh.
        # One older than the replay log: wake every agent of this Computer first.
        cursor, lost = store.replay_start(computer_id, int(raw) if raw else None)
        flag = hub.subscribe(computer_id)

        async def stream() -> AsyncIterator[bytes]:
            nonlocal cursor
            # A comment opens the stream at once (clients see the 200 without waiting for
            # an event); the reconnect delay rides on the first real event.
            retry = "retry: 2000\n"
            try:
                yield b": connected\n\n"
                if lost is not None:
                    # The agent list may have changed too: `agents` (agent_id null) first.
                    resync = [("agents", None), *(("wake", a) for a in lost)]
                    for event, agent_id in resync:
                        data = orjson.dumps({"agent_id": agent_id}).decode()
                        yield f"{retry}id: {cursor}\nevent: {event}\ndata: {data}\n\n".encode()
                        retry = ""
                while not hub.closed:
                    flag.clear()
                    rows = store.events_after(computer_id, cursor)
                    for event_id, event, data in rows:
                        cursor = event_id
                        yield f"{retry}id: {event_id}\nevent: {event}\ndata: {data}\n\n".encode()
                        retry = ""
                    if rows:
                        continue
                    with anyio.move_on_after(ping_seconds) as waited:
                        await flag.wait()
                    if waited.cancelled_caught:
                        yield f"{retry}id: {cursor}\nevent: ping\ndata: {{}}\n\n".encode()
                        retry = ""
            finally:
                hub.unsubscribe(computer_id, flag)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    # ------------------------------------------------------------ agent API

    async def post_reply(request: Request) -> Response:
        identity = agent(request)
        body = await read_body(request, m.Reply)
        return json_response(store.reply(identity, body.room_id, body.body, body.thread_of), 201)

    async def get_agent_tasks(request: Request) -> Response:
        identity = agent(request)
        return json_response(
            store.list_tasks(agent_actor(identity), uuid_param(request, "room_id"))
        )

    async def post_agent_task(request: Request) -> Response:
        identity = agent(request)
        body = await read_body(request, m.TaskCreate)
        task = store.create_task(agent_actor(identity), body.room_id, body.title, body.assignee)
        return json_response(task, 201)

    async def post_agent_convert(request: Request) -> Response:
        identity = agent(request)
        body = await read_body(request, m.TaskConvert)
        task = store.convert_task(agent_actor(identity), body.message_id, body.assignee)
        return json_response(task, 201)

    async def post_agent_claim(request: Request) -> Response:
        identity = agent(request)
        body = await read_body(request, m.TaskClaim)
        return json_response(
            store.claim_task(agent_actor(identity), task_number(request), body.room_id)
        )

    async def post_agent_status(request: Request) -> Response:
        identity = agent(request)
        body = await read_body(request, m.TaskStatusSet)
        return json_response(
            store.set_task_status(
                agent_actor(identity), task_number(request), body.status, body.note, body.room_id
            )
        )

    async def post_agent_assign(request: Request) -> Response:
        identity = agent(request)
        body = await read_body(request, m.TaskAssign)
        return json_response(
            store.assign_task(
                agent_actor(identity), task_number(request), body.assignee, body.room_id
            )
        )

    async def post_reminder(request: Request) -> Response:
        identity = agent(request)
        body = await read_body(request, m.ReminderCreate)
        try:
            rules.zone_of(body.tz)
        except ValueError as exc:
            raise Refused(str(exc)) from exc
        schedule = rules.Schedule(
            at=body.at,
            every=body.every,
            daily=body.daily,
            weekly_day=body.weekly.day if body.weekly else None,
            weekly_time=body.weekly.time if body.weekly else None,
            tz=body.tz,
        )
        reminder = store.create_reminder(identity, body.room_id, body.title, schedule)
        scheduler.poke()
        return json_response(reminder, 201)

    async def get_reminders(request: Request) -> Response:
        return json_response(store.list_reminders(agent(request).agent_id))

    async def delete_reminder(request: Request) -> Response:
        store.delete_reminder(agent(request).agent_id, request.path_params["reminder_id"])
        scheduler.poke()
        return no_content()

    async def put_mute(request: Request) -> Response:
        identity = agent(request)
        body = await read_body(request, m.MuteSet)
        return json_response(store.mute(identity, request.path_params["room_id"], body.until))

    async def delete_mute(request: Request) -> Response:
        identity = agent(request)
        store.unmute(identity.agent_id, request.path_params["room_id"])
        return no_content()

    # ------------------------------------------------------------ errors and life

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return json_response(exc.body(), exc.status)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "bad_request")
        message = {
            404: f"no such endpoint {request.url.path}; see openapi/upstream.yaml",
            405: f"{request.method} is not allowed on {request.url.path}",
        }.get(exc.status_code, str(exc.detail))
        body = {"error": {"code": code, "message": message}}
        return json_response(body, exc.status_code, headers=dict(exc.headers or {}))

    async def server_error(request: Request, exc: Exception) -> Response:
        # Starlette logs the exception and re-raises it after this answer is sent.
        body = {
            "error": {
                "code": "internal",
                "message": f"the server failed on {request.method} {request.url.path}; "
                "this is a bug of the server, its log has the details",
            }
        }
        return json_response(body, 500)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tasks:
            if run_scheduler:
                tasks.start_soon(scheduler.run)
            yield
            tasks.cancel_scope.cancel()

    routes = [
        route("/health", GET=health),
        # the Computer
        route("/computer/connect", POST=post_connect),
        route("/computer/events", GET=get_events),
        route("/computer/agents", GET=get_computer_agents),
        route("/computer/models", PUT=put_models),
        route("/computer/agents/{agent_id}/problem", PUT=put_problem, DELETE=delete_problem),
        route("/computer/agents/{agent_id}/token", POST=post_agent_token),
        route("/computer/agents/{agent_id}/unread", POST=post_unread),
        route("/computer/agents/{agent_id}/turns", POST=post_turn),
        route("/computer/agents/{agent_id}/ack", POST=post_ack),
        route("/computer/turns/{turn_id}/events", POST=post_events),
        route("/computer/turns/{turn_id}/finish", POST=post_finish),
        # agents, through `crew`
        route("/agent/reply", POST=post_reply),
        route("/agent/tasks", ("room_id",), GET=get_agent_tasks, POST=post_agent_task),
        route("/agent/tasks/convert", POST=post_agent_convert),
        route("/agent/tasks/{number}/claim", POST=post_agent_claim),
        route("/agent/tasks/{number}/status", POST=post_agent_status),
        route("/agent/tasks/{number}/assign", POST=post_agent_assign),
        route("/agent/reminders", POST=post_reminder, GET=get_reminders),
        route("/agent/reminders/{reminder_id}", DELETE=delete_reminder),
        route("/agent/mutes/{room_id}", PUT=put_mute, DELETE=delete_mute),
        # the user (demo, UI, tests)
        route("/api/computers", POST=post_computer, GET=get_computers),
        route("/api/agents", POST=post_agent, GET=get_agents),
        route("/api/agents/{agent_id}", PATCH=patch_agent),
        route("/api/agents/{agent_id}/positions", GET=get_positions),
        route("/api/agents/{agent_id}/mutes/{room_id}", DELETE=delete_user_mute),
        route("/api/rooms", POST=post_room, GET=get_rooms),
        route("/api/rooms/{room_id}", GET=get_room),
        route(
            "/api/rooms/{room_id}/messages",
            ("after_seq", "limit"),
            POST=post_message,
            GET=get_messages,
        ),
        route("/api/turns", ("agent_id", "limit"), GET=get_turns),
        route("/api/turns/{turn_id}", GET=get_turn),
        route("/api/tasks", ("room_id",), GET=get_user_tasks, POST=post_user_task),
        route("/api/tasks/convert", POST=post_user_convert),
        route("/api/tasks/{number}/status", POST=post_user_status),
        route("/api/tasks/{number}/assign", POST=post_user_assign),
        route("/api/dev/clock", POST=post_dev_clock),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={ApiError: api_error, HTTPException: http_error, 500: server_error},
        lifespan=lifespan,
    )
    app.state.store = store
    app.state.scheduler = scheduler
    app.state.hub = hub
    return app
