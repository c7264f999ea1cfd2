"""What the user calls (`/api/...`, always with the user token): Computers, agents,
rooms and messages, turns, tasks, and the dev clock."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from crew_server import models as m
from crew_server.api.http import (
    Context,
    int_param,
    json_response,
    no_content,
    read_body,
    task_number,
    uuid_param,
)
from crew_server.api.operation import SEQ, UUID, Op
from crew_server.api.sign_in import CODE_SECONDS
from crew_server.clock import iso
from crew_server.errors import NotConnected, NotFound, Refused
from crew_server.store.controls import NO_COMPUTER, NOT_LISTENING


async def create_computer(ctx: Context, request: Request) -> Response:
    """A Computer credential (token shown once)."""
    ctx.user(request)
    body = await read_body(request, m.ComputerCreate)
    computer_id, token = ctx.store.create_computer(body.name)
    return json_response({"computer_id": computer_id, "token": token}, 201)


async def list_computers(ctx: Context, request: Request) -> Response:
    """Computers and what they reported."""
    ctx.user(request)
    return json_response(ctx.store.list_computers())


async def create_sign_in_code(ctx: Context, request: Request) -> Response:
    """A one-time sign-in link for the web app (the user token never goes into a URL)."""
    ctx.user(request)
    code = ctx.sign_in_codes.mint()
    return json_response(
        {"code": code, "path": f"/login#code={code}", "expires_in_s": CODE_SECONDS}, 201
    )


# PATCH fields where null is a value, not "no change".
_NULLABLE = frozenset({"computer_id", "turn_time_limit_s"})


async def create_agent(ctx: Context, request: Request) -> Response:
    """A new agent (422 `unknown_model` for a model its Computer did not report)."""
    ctx.user(request)
    body = await read_body(request, m.AgentCreate)
    created = ctx.store.create_agent(
        body.handle,
        body.name,
        body.persona,
        body.model,
        body.engine,
        body.computer_id,
        body.turn_time_limit_s,
        body.egress.model_dump() if body.egress else None,
        body.budget,
        body.permission,
        body.capabilities,
    )
    return json_response(created, 201)


async def get_capabilities(ctx: Context, request: Request) -> Response:
    """The agent's MCP servers and skills; secret values read "(set)"."""
    ctx.user(request)
    return json_response(ctx.store.agent_capabilities(request.path_params["agent_id"]))


async def get_capabilities_state(ctx: Context, request: Request) -> Response:
    """What the agent's Computer last reported of its capabilities."""
    ctx.user(request)
    return json_response(ctx.store.capabilities_state(request.path_params["agent_id"]))


async def put_capabilities(ctx: Context, request: Request) -> Response:
    """Replace the agent's MCP servers and skills (its Computer gets `agents`)."""
    ctx.user(request)
    body = await read_body(request, m.CapabilitiesPut)
    return json_response(
        ctx.store.set_capabilities(request.path_params["agent_id"], body.document())
    )


async def patch_agent(ctx: Context, request: Request) -> Response:
    """Change an agent's settings."""
    ctx.user(request)
    body = await read_body(request, m.AgentPatch)
    # null means "no change", except computer_id (off its Computer) and
    # turn_time_limit_s (back to the Computer's default)
    changes = {
        k: v
        for k, v in body.model_dump(exclude_unset=True).items()
        if v is not None or k in _NULLABLE
    }
    return json_response(ctx.store.update_agent(request.path_params["agent_id"], changes))


async def list_agents(ctx: Context, request: Request) -> Response:
    """Agents with status and problem."""
    ctx.user(request)
    return json_response(ctx.store.list_agents())


async def resume_budget(ctx: Context, request: Request) -> Response:
    """The user lets an agent held by its budget take one more turn (it is woken)."""
    ctx.user(request)
    return json_response(ctx.store.resume_budget(request.path_params["agent_id"]))


def heard_by_its_computer(ctx: Context, agent_id: str) -> None:
    """Refuse (409) a Stop or Wake the agent's Computer cannot hear now: none, or not
    connected. With PostgreSQL the Computer's stream may be open on another server
    process, so there only "none" is known; the request waits in its event log then."""
    computer_id = ctx.store.computer_of_agent(agent_id)
    handle = ctx.store.get_agent(agent_id)["handle"]
    if computer_id is None:
        raise NotConnected(NO_COMPUTER.format(handle=handle))
    if ctx.store.dialect == "sqlite" and computer_id not in ctx.hub.listening():
        raise NotConnected(NOT_LISTENING.format(handle=handle))


async def stop_turn(ctx: Context, request: Request) -> Response:
    """A person stops the agent's running turn (issue 25): `stop` on its Computer's stream."""
    ctx.user(request)
    agent_id = request.path_params["agent_id"]
    body = await read_body(request, m.StopTurn)
    heard_by_its_computer(ctx, agent_id)
    return json_response(ctx.store.stop_turn(agent_id, body.turn_id), 202)


async def wake_agent(ctx: Context, request: Request) -> Response:
    """A person wakes the agent: `wake` with `now` on its Computer's stream (issue 25)."""
    ctx.user(request)
    agent_id = request.path_params["agent_id"]
    heard_by_its_computer(ctx, agent_id)
    return json_response(ctx.store.wake_now(agent_id), 202)


async def positions(ctx: Context, request: Request) -> Response:
    """An agent's delivered and read positions per room."""
    ctx.user(request)
    return json_response(ctx.store.positions(request.path_params["agent_id"]))


async def unmute(ctx: Context, request: Request) -> Response:
    """The user unmutes an agent."""
    ctx.user(request)
    ctx.store.unmute(request.path_params["agent_id"], request.path_params["room_id"])
    return no_content()


async def create_room(ctx: Context, request: Request) -> Response:
    """A dm (200 with the existing one) or a group."""
    ctx.user(request)
    body = await read_body(request, m.RoomCreate)
    room, created = ctx.store.create_room(body.kind, body.title, body.agent_ids)
    return json_response(room, 201 if created else 200)


async def list_rooms(ctx: Context, request: Request) -> Response:
    """Dms and groups."""
    ctx.user(request)
    return json_response(ctx.store.list_rooms())


async def get_room(ctx: Context, request: Request) -> Response:
    """One room."""
    ctx.user(request)
    return json_response(ctx.store.get_room(request.path_params["room_id"]))


async def patch_room(ctx: Context, request: Request) -> Response:
    """Change a group's title and members, a room's loop guard."""
    ctx.user(request)
    body = await read_body(request, m.RoomPatch)
    room_id = request.path_params["room_id"]
    group_change = body.title is not None or body.agent_ids is not None
    if group_change:
        ctx.store.update_room(room_id, body.title, body.agent_ids)
    if not group_change or body.agent_hop_limit is not None or body.agent_rate_limit is not None:
        ctx.store.set_loop_limits(room_id, body.agent_hop_limit, body.agent_rate_limit)
    return json_response(ctx.store.get_room(room_id))


async def delete_agent(ctx: Context, request: Request) -> Response:
    """Delete an agent (its dm goes, its tokens stop working)."""
    ctx.user(request)
    ctx.store.delete_agent(request.path_params["agent_id"])
    return no_content()


async def delete_room(ctx: Context, request: Request) -> Response:
    """Delete a dm or a group with its threads and messages."""
    ctx.user(request)
    ctx.store.delete_room(request.path_params["room_id"])
    return no_content()


async def delete_computer(ctx: Context, request: Request) -> Response:
    """Delete a Computer: its token is revoked, its open event stream ends."""
    ctx.user(request)
    # The store wakes the Computer's open stream after the commit: it sees and ends.
    ctx.store.delete_computer(request.path_params["computer_id"])
    return no_content()


async def post_message(ctx: Context, request: Request) -> Response:
    """The user posts."""
    ctx.user(request)
    body = await read_body(request, m.MessageCreate)
    message = ctx.store.user_post(request.path_params["room_id"], body.body, body.thread_of)
    return json_response(message, 201)


async def list_messages(ctx: Context, request: Request) -> Response:
    """Messages after `after_seq`."""
    ctx.user(request)
    after = int_param(request, "after_seq", 0, 0, 2**53)
    limit = int_param(request, "limit", 500, 1, 1000)
    return json_response(ctx.store.list_messages(request.path_params["room_id"], after, limit))


async def list_turns(ctx: Context, request: Request) -> Response:
    """Turns without events, newest first."""
    ctx.user(request)
    limit = int_param(request, "limit", 100, 1, 1000)
    return json_response(ctx.store.list_turns(uuid_param(request, "agent_id"), limit))


async def get_turn(ctx: Context, request: Request) -> Response:
    """A turn with its events."""
    ctx.user(request)
    return json_response(ctx.store.get_turn(request.path_params["turn_id"]))


async def list_tasks(ctx: Context, request: Request) -> Response:
    """Tasks (of a room when given)."""
    actor = ctx.user(request)
    return json_response(ctx.store.list_tasks(actor, uuid_param(request, "room_id")))


async def create_task(ctx: Context, request: Request) -> Response:
    """A task, as the user."""
    actor = ctx.user(request)
    body = await read_body(request, m.TaskCreate)
    return json_response(ctx.store.create_task(actor, body.room_id, body.title, body.assignee), 201)


async def convert_task(ctx: Context, request: Request) -> Response:
    """Make a message a task, as the user."""
    actor = ctx.user(request)
    body = await read_body(request, m.TaskConvert)
    return json_response(ctx.store.convert_task(actor, body.message_id, body.assignee), 201)


async def task_status(ctx: Context, request: Request) -> Response:
    """Move a task, as the user."""
    actor = ctx.user(request)
    body = await read_body(request, m.TaskStatusSet)
    return json_response(
        ctx.store.set_task_status(actor, task_number(request), body.status, body.note, body.room_id)
    )


async def assign_task(ctx: Context, request: Request) -> Response:
    """Assign a task, as the user."""
    actor = ctx.user(request)
    body = await read_body(request, m.TaskAssign)
    return json_response(
        ctx.store.assign_task(actor, task_number(request), body.assignee, body.room_id)
    )


async def dev_clock(ctx: Context, request: Request) -> Response:
    """--dev only: move the clock forward and fire what is due."""
    ctx.user(request)
    if not ctx.dev:
        raise NotFound("the clock hook exists only on a server started with --dev")
    body = await read_body(request, m.DevClock)
    try:
        now = ctx.clock.advance(body.advance_seconds)
    except (ValueError, OverflowError) as exc:
        raise Refused(str(exc)) from exc
    fired = ctx.scheduler.run_due()
    ctx.scheduler.release_due()
    ctx.scheduler.poke()
    return json_response({"now": iso(now), "fired": fired})


# This caller's rows of the route table (`routes.OPS` joins them): the app serves them,
# `crew_server.openapi` documents them.
OPS: list[Op] = [
    Op(
        "post",
        "/api/computers",
        "createComputer",
        "A Computer credential (token shown once).",
        "user",
        m.ComputerCreate,
        status=201,
        answer=m.ComputerCreated,
        handler=create_computer,
    ),
    Op(
        "get",
        "/api/computers",
        "listComputers",
        "Computers and what they reported.",
        "user",
        answer=m.ComputerInfo,
        many=True,
        handler=list_computers,
    ),
    Op(
        "delete",
        "/api/computers/{computer_id}",
        "deleteComputer",
        "Delete a Computer: its token is revoked at once (every call with it answers 401 "
        "saying so), so are its agents' tokens; its open event stream gets `revoked` and ends; "
        "its running turns end `interrupted`; its agents stay, without a Computer "
        "(`computer_id` null). 404 for a Computer that does not exist (or was deleted).",
        "user",
        status=204,
        handler=delete_computer,
    ),
    Op(
        "post",
        "/api/sign-in-codes",
        "createSignInCode",
        "A sign-in link for the web app: `path` (`/login#code=…`) signs a browser in once, "
        "within `expires_in_s`; the user token itself never goes into a URL (browsers keep "
        "URLs in their history).",
        "user",
        status=201,
        answer=m.SignInCode,
        handler=create_sign_in_code,
    ),
    Op(
        "post",
        "/api/agents",
        "createAgent",
        "A new agent (its Computer gets `agents`). A model its Computer did not report is "
        "refused (422 `unknown_model` with the `nearest` ones); when the Computer has not "
        "reported any yet, the model is accepted and `warnings` says it was not checked. "
        "An egress policy the server cannot read is refused (422 `invalid_egress`, why), "
        "so is a budget (422 `invalid_budget`, why), a permission policy (422 "
        "`invalid_permission`, why) and capabilities (422 `invalid_capabilities`, why).",
        "user",
        m.AgentCreate,
        status=201,
        answer=m.AgentSaved,
        handler=create_agent,
    ),
    Op(
        "get",
        "/api/agents",
        "listAgents",
        "Agents with status (from turns) and problem.",
        "user",
        answer=m.AgentWithStatus,
        many=True,
        handler=list_agents,
    ),
    Op(
        "patch",
        "/api/agents/{agent_id}",
        "patchAgent",
        "Change settings (its Computer, old and new, gets `agents`). A new model or Computer "
        "is checked as in createAgent, a new `egress`, `permission` or `capabilities` too (each "
        "replaces the whole policy or document), a new `budget` too (it replaces the whole budget and wakes the agent). null "
        "leaves a field as it is, except `computer_id` (takes the agent off its Computer) and "
        "`turn_time_limit_s` (the Computer's default).",
        "user",
        m.AgentPatch,
        answer=m.AgentSaved,
        handler=patch_agent,
    ),
    Op(
        "delete",
        "/api/agents/{agent_id}",
        "deleteAgent",
        "Delete an agent: its dm goes (with its messages), its messages in groups stay (the "
        "author reads `<name> (deleted)`, handle null); its tokens stop working (401); it "
        "leaves every group (its positions, mutes and reminders go); its tasks are unassigned; "
        "its running turn ends `cancelled` and its Computer gets `agents` (the runner stops). "
        "Its handle is free again. 404 for an agent that does not exist (or was deleted).",
        "user",
        status=204,
        handler=delete_agent,
    ),
    Op(
        "get",
        "/api/agents/{agent_id}/capabilities",
        "getCapabilities",
        "The agent's MCP servers and skills. Secret values (`secret_environment`, "
        '`secret_headers`) are never shown: each reads `"(set)"`.',
        "user",
        answer=m.Capabilities,
        handler=get_capabilities,
    ),
    Op(
        "put",
        "/api/agents/{agent_id}/capabilities",
        "putCapabilities",
        "Replace the agent's MCP servers (local: an argv `command` run inside its sandbox; "
        "remote: a `url`, reached through its Computer's gateway) and skills (name, "
        "description, Markdown body, optional files; body and files at most 64 KiB). The "
        'whole document; a secret sent as `"(set)"` keeps its stored value. Anything the '
        "server cannot take (an unknown field, a bad or duplicate name, a url that is not "
        "http(s), a path with `..`, a skill too large) is refused with 422 "
        "`invalid_capabilities` and the reason. Its Computer gets `agents` and restarts the "
        "agent's warm server (not its session). Answers the document as getCapabilities.",
        "user",
        m.CapabilitiesPut,
        answer=m.Capabilities,
        handler=put_capabilities,
    ),
    Op(
        "get",
        "/api/agents/{agent_id}/capabilities/state",
        "getCapabilitiesState",
        "What the agent's Computer last reported of its capabilities: each MCP server's "
        "state (`starting`, `connected`, `failed` with `reason`, `disabled`) and whether the "
        "report is of the capabilities stored now (`current`).",
        "user",
        answer=m.CapabilitiesState,
        handler=get_capabilities_state,
    ),
    Op(
        "post",
        "/api/agents/{agent_id}/budget/resume",
        "resumeBudget",
        "Resume an agent held by its budget once: its next claim with messages hands them out "
        "though a cap is reached (exactly one more turn; asking again before it ran is still "
        "one). Wakes the agent. The caps stay; raise one to resume for good.",
        "user",
        answer=m.BudgetResumed,
        handler=resume_budget,
    ),
    Op(
        "post",
        "/api/agents/{agent_id}/stop",
        "stopTurn",
        "Stop the agent's running turn `turn_id`: its Computer gets `stop {agent_id, "
        "turn_id}` and cancels that turn only if it is still the one running (a late stop "
        "does nothing). The turn ends `cancelled` without ack: its messages stay unread, a "
        "notice in its rooms says it was stopped, and the agent runs again at a new message "
        "or a Wake. 404: no such agent or turn of it; 409: the turn is not running (its "
        "status says), or the agent's Computer is none or not connected.",
        "user",
        m.StopTurn,
        status=202,
        answer=m.StopAsked,
        handler=stop_turn,
    ),
    Op(
        "post",
        "/api/agents/{agent_id}/wake",
        "wakeAgent",
        "Wake the agent: its Computer gets `wake {agent_id, now: true}` and runs a turn now "
        "for its unread messages, even inside a retry's backoff (nothing unread: nothing "
        "runs). During a turn it merges into the next one. 404: no such agent; 409: its "
        "Computer is none or not connected.",
        "user",
        status=202,
        answer=m.WakeAsked,
        handler=wake_agent,
    ),
    Op(
        "get",
        "/api/agents/{agent_id}/positions",
        "agentPositions",
        "Delivered and read positions per room.",
        "user",
        answer=m.Position,
        many=True,
        handler=positions,
    ),
    Op(
        "delete",
        "/api/agents/{agent_id}/mutes/{room_id}",
        "userUnmute",
        "The user unmutes an agent (wakes nobody).",
        "user",
        status=204,
        handler=unmute,
    ),
    Op(
        "post",
        "/api/rooms",
        "createRoom",
        "A dm (one agent; 200 with the existing one) or a group.",
        "user",
        m.RoomCreate,
        status=201,
        answer=m.Room,
        extra={"200": m.Room},
        handler=create_room,
    ),
    Op(
        "get",
        "/api/rooms",
        "listRooms",
        "Dms and groups.",
        "user",
        answer=m.Room,
        many=True,
        handler=list_rooms,
    ),
    Op(
        "get",
        "/api/rooms/{room_id}",
        "getRoom",
        "One room (threads too).",
        "user",
        answer=m.Room,
        handler=get_room,
    ),
    Op(
        "patch",
        "/api/rooms/{room_id}",
        "patchRoom",
        "Change a dm's or group's loop guard: `agent_hop_limit` (0–100), `agent_rate_limit` "
        "(1–600 a minute). Out of range: 422 with the reason; a thread: 422 (it follows its "
        "group). A pause on stays on until the user writes. A group's `title` (as in "
        "createRoom) and members (`agent_ids`, the whole list: a removed agent is no longer "
        "woken there and its position and mutes there go; an added one starts at the newest "
        "message); for a dm or a thread: 422 with the reason.",
        "user",
        m.RoomPatch,
        answer=m.Room,
        handler=patch_room,
    ),
    Op(
        "delete",
        "/api/rooms/{room_id}",
        "deleteRoom",
        "Delete a dm or a group with its threads, messages, tasks, reminders, positions and "
        "mutes; its agents stay. A pending approval card in it ends `expired`. A thread: 422 "
        "(it goes with its group). A live page of the room ends.",
        "user",
        status=204,
        handler=delete_room,
    ),
    Op(
        "post",
        "/api/rooms/{room_id}/messages",
        "postMessage",
        "The user posts (in the thread of `thread_of`, created when missing).",
        "user",
        m.MessageCreate,
        status=201,
        answer=m.Message,
        handler=post_message,
    ),
    Op(
        "get",
        "/api/rooms/{room_id}/messages",
        "listMessages",
        "Messages after `after_seq`.",
        "user",
        answer=m.Message,
        many=True,
        query=(("after_seq", SEQ), ("limit", {"type": "integer", "minimum": 1, "maximum": 1000})),
        handler=list_messages,
    ),
    Op(
        "get",
        "/api/turns",
        "listTurns",
        "Turns without events, newest first.",
        "user",
        answer=m.Turn,
        many=True,
        query=(("agent_id", UUID), ("limit", {"type": "integer", "minimum": 1, "maximum": 1000})),
        handler=list_turns,
    ),
    Op(
        "get",
        "/api/turns/{turn_id}",
        "getTurn",
        "A turn with its events.",
        "user",
        answer=m.TurnWithEvents,
        handler=get_turn,
    ),
    Op(
        "get",
        "/api/tasks",
        "listTasks",
        "Tasks (of a room when given).",
        "user",
        answer=m.Task,
        many=True,
        query=(("room_id", UUID),),
        handler=list_tasks,
    ),
    Op(
        "post",
        "/api/tasks",
        "createTask",
        "As the agent endpoint, acting as the user.",
        "user",
        m.TaskCreate,
        status=201,
        answer=m.Task,
        handler=create_task,
    ),
    Op(
        "post",
        "/api/tasks/convert",
        "convertTask",
        "As the agent endpoint, acting as the user.",
        "user",
        m.TaskConvert,
        status=201,
        answer=m.Task,
        handler=convert_task,
    ),
    Op(
        "post",
        "/api/tasks/{number}/status",
        "taskStatus",
        "Move a task as the user.",
        "user",
        m.TaskStatusSet,
        answer=m.Task,
        handler=task_status,
    ),
    Op(
        "post",
        "/api/tasks/{number}/assign",
        "assignTask",
        "Assign a task as the user.",
        "user",
        m.TaskAssign,
        answer=m.Task,
        handler=assign_task,
    ),
    Op(
        "post",
        "/api/dev/clock",
        "devClock",
        "--dev only (404 otherwise), with the user token: move the server clock "
        "forward and fire due reminders.",
        "user",
        m.DevClock,
        answer=m.ClockAnswer,
        handler=dev_clock,
    ),
]
