"""What the Computer calls (`/computer/...`, computer token): connect, its agents and
their problems, the event stream, unread claims, turns and their events.

Every call but `connect` names its connection with the `Crew-Epoch` header
(`Context.connection`): a Computer replaced by a newer connection with the same
token is told `superseded` instead of acting for the new one.
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from crew_server import models as m
from crew_server.api.http import Context, json_response, no_content, read_body
from crew_server.api.operation import Op
from crew_server.api.stream import event_stream
from crew_server.clock import iso
from crew_server.errors import Conflict, Invalid


async def connect(ctx: Context, request: Request) -> Response:
    """A new connection epoch for this Computer; streams of older ones end."""
    computer_id = ctx.computer(request)
    body = await read_body(request, m.Connect)
    answer = ctx.store.connect(
        computer_id, body.hostname, body.platform, body.version, body.capacity
    )
    # Open streams of the replaced connection look at the epoch and end.
    ctx.hub.notify({computer_id})
    return json_response(answer)


async def events(ctx: Context, request: Request) -> Response:
    """The Computer's SSE stream."""
    caller = ctx.connection(request)
    return event_stream(
        ctx.store, ctx.hub, caller, request.headers.get("last-event-id"), ctx.ping_seconds
    )


async def agents(ctx: Context, request: Request) -> Response:
    """The agents assigned to this Computer."""
    return json_response(ctx.store.computer_agents(ctx.connection(request).computer_id))


async def put_models(ctx: Context, request: Request) -> Response:
    """The models this Computer can run."""
    caller = ctx.connection(request)
    body = await read_body(request, m.ModelsPut)
    ctx.store.set_models(caller.computer_id, body.models)
    return no_content()


async def put_problem(ctx: Context, request: Request) -> Response:
    """Why an agent cannot run."""
    caller = ctx.connection(request)
    body = await read_body(request, m.ProblemPut)
    ctx.store.set_problem(caller.computer_id, request.path_params["agent_id"], body.reason)
    return no_content()


async def delete_problem(ctx: Context, request: Request) -> Response:
    """The agent can run again."""
    caller = ctx.connection(request)
    ctx.store.set_problem(caller.computer_id, request.path_params["agent_id"], None)
    return no_content()


async def put_capabilities_state(ctx: Context, request: Request) -> Response:
    """What the Computer applied of an agent's capabilities; each MCP server's state."""
    caller = ctx.connection(request)
    body = await read_body(request, m.CapabilitiesStatePut)
    ctx.store.set_capabilities_state(
        caller.computer_id,
        request.path_params["agent_id"],
        body.capabilities_version,
        [server.model_dump() for server in body.mcp_servers],
    )
    return no_content()


async def agent_token(ctx: Context, request: Request) -> Response:
    """A new agent token of the caller's connection."""
    caller = ctx.connection(request)
    token = ctx.store.issue_agent_token(
        caller.computer_id, request.path_params["agent_id"], caller.epoch
    )
    return json_response({"token": token})


async def claim_unread(ctx: Context, request: Request) -> Response:
    """The agent's unread messages by room, now delivered."""
    caller = ctx.connection(request)
    body = await read_body(request, m.UnreadClaim)
    rooms, more, paused = ctx.store.claim_turn(
        caller.computer_id, request.path_params["agent_id"], caller.epoch, body.max_messages
    )
    answer: dict[str, object] = {"rooms": rooms, "more": more}
    if paused is not None:
        answer["paused"] = paused
    return json_response(answer)


async def register_turn(ctx: Context, request: Request) -> Response:
    """A new running turn: its id and fence (the caller's epoch)."""
    caller = ctx.connection(request)
    body = await read_body(request, m.TurnRegister)
    registered = ctx.store.register_turn(
        caller.computer_id,
        request.path_params["agent_id"],
        [r.model_dump() for r in body.rooms],
        body.input,
        body.engine,
        body.model,
        body.session_id,
        caller.epoch,
    )
    return json_response(registered, 201)


async def turn_events(ctx: Context, request: Request) -> Response:
    """A batch of engine events, numbered from `first_index`."""
    computer_id = ctx.connection(request).computer_id
    body = await read_body(request, m.EventsBatch)
    for offset, item in enumerate(body.events):
        if item.index is not None and item.index != body.first_index + offset:
            raise Conflict(
                f"event {offset} has index {item.index} but first_index makes it "
                f"{body.first_index + offset}; number events from first_index"
            )
    stored = []
    for offset, item in enumerate(body.events):
        try:
            data = orjson.dumps(item.data).decode()
        except orjson.JSONEncodeError as exc:  # e.g. an integer beyond 64 bits
            raise Invalid(f"events.{offset}.data cannot be stored: {exc}") from exc
        stored.append({"type": item.type, "at": iso(item.at), "data_json": data})
    ctx.store.add_events(
        computer_id, request.path_params["turn_id"], body.fence, body.first_index, stored
    )
    return no_content()


async def finish_turn(ctx: Context, request: Request) -> Response:
    """The turn's result and usage; a tail of events that never arrived becomes a gap."""
    computer_id = ctx.connection(request).computer_id
    body = await read_body(request, m.TurnFinish)
    ctx.store.finish_turn(
        computer_id,
        request.path_params["turn_id"],
        body.fence,
        body.status,
        body.failure.model_dump(by_alias=True) if body.failure else None,
        body.usage.model_dump() if body.usage else None,
        body.event_count,
        body.input,
        body.gateway_usage.model_dump() if body.gateway_usage else None,
        {str(step): at for step, at in body.trace.items()} if body.trace is not None else None,
    )
    return no_content()


async def ack(ctx: Context, request: Request) -> Response:
    """The turn handled its messages (or set them aside): read := delivered."""
    computer_id = ctx.connection(request).computer_id
    body = await read_body(request, m.Ack)
    ctx.store.ack(
        computer_id,
        request.path_params["agent_id"],
        body.turn_id,
        body.fence,
        body.set_aside.reason if body.set_aside else None,
        only_if_answered=body.only_if_answered,
    )
    return no_content()


# This caller's rows of the route table (`routes.OPS` joins them): the app serves them,
# `crew_server.openapi` documents them.
OPS: list[Op] = [
    Op(
        "post",
        "/computer/connect",
        "connect",
        "Confirm the credential; get a new connection epoch (older running turns become interrupted).",
        "computer",
        m.Connect,
        answer=m.ConnectAnswer,
        handler=connect,
    ),
    Op(
        "get",
        "/computer/events",
        "computerEvents",
        "SSE: `wake` {agent_id, now?}, `agents` {agent_id}, `stop` {agent_id, turn_id}, "
        "`prewarm` {agent_ids} (start these agents' engines; never a turn), `revoked` {reason} "
        "(then the stream ends), `ping` {} every 15 s; `id:` on every event; "
        "send `Last-Event-ID` to replay what was missed.",
        "computer",
        handler=events,
    ),
    Op(
        "get",
        "/computer/agents",
        "computerAgents",
        "The agents assigned to this Computer, each with its `capabilities` (MCP servers and "
        "skills, secrets in clear) and `capabilities_version` (a new one: restart the agent's "
        "warm server, keep its session).",
        "computer",
        answer=m.ComputerAgent,
        many=True,
        handler=agents,
    ),
    Op(
        "put",
        "/computer/models",
        "putModels",
        "The models this Computer can run.",
        "computer",
        m.ModelsPut,
        status=204,
        handler=put_models,
    ),
    Op(
        "put",
        "/computer/agents/{agent_id}/problem",
        "putProblem",
        "Why this agent cannot run.",
        "computer",
        m.ProblemPut,
        status=204,
        handler=put_problem,
    ),
    Op(
        "delete",
        "/computer/agents/{agent_id}/problem",
        "deleteProblem",
        "The agent can run again.",
        "computer",
        status=204,
        handler=delete_problem,
    ),
    Op(
        "put",
        "/computer/agents/{agent_id}/capabilities/state",
        "putCapabilitiesState",
        "What this Computer applied of the agent's capabilities (`capabilities_version` of "
        "its sync) and each MCP server's state (`starting`, `connected`, `failed` with "
        "`reason`, `disabled`); the whole list each time. The user sees it (the agent page, "
        "getCapabilitiesState).",
        "computer",
        m.CapabilitiesStatePut,
        status=204,
        handler=put_capabilities_state,
    ),
    Op(
        "post",
        "/computer/agents/{agent_id}/token",
        "agentToken",
        "A new agent token; older ones stay valid until the Computer reconnects.",
        "computer",
        answer=m.TokenAnswer,
        handler=agent_token,
    ),
    Op(
        "post",
        "/computer/agents/{agent_id}/unread",
        "claimUnread",
        "Unread messages by room (after the read position); marks them delivered. An agent "
        "at 100 % of a budget cap gets none (they stay unread) and `paused` says why and "
        "until when: no turn now; the server wakes the agent when it may go on.",
        "computer",
        m.UnreadClaim,
        answer=m.UnreadAnswer,
        handler=claim_unread,
    ),
    Op(
        "post",
        "/computer/agents/{agent_id}/turns",
        "registerTurn",
        "Record a new running turn → its id and fence.",
        "computer",
        m.TurnRegister,
        status=201,
        answer=m.TurnRegistered,
        handler=register_turn,
    ),
    Op(
        "post",
        "/computer/agents/{agent_id}/ack",
        "ack",
        "The turn handled its messages: read := delivered.",
        "computer",
        m.Ack,
        status=204,
        handler=ack,
    ),
    Op(
        "post",
        "/computer/turns/{turn_id}/events",
        "turnEvents",
        "A batch of engine events from `first_index`; a jump leaves a recorded gap.",
        "computer",
        m.EventsBatch,
        status=204,
        handler=turn_events,
    ),
    Op(
        "post",
        "/computer/turns/{turn_id}/finish",
        "finishTurn",
        "The turn's result and usage (the engine's; `gateway_usage`: the model gateway's).",
        "computer",
        m.TurnFinish,
        status=204,
        handler=finish_turn,
    ),
]
