"""Approvals (issue 24): the Computer asks the person about a tool call of a running turn
(`/computer/...`, computer token + `Crew-Epoch`) and waits for the answer; the user
answers (`/api/approvals...`, user token). The store part is `store.approvals`.

The Computer's wait is a long poll that holds no database transaction and never blocks
the event loop: it reads the approval, then waits on the Computer's `EventHub` flag,
which every change of one of its approvals sets (`approval_state.nudge`: in this
process after the commit, in another server process by PostgreSQL's NOTIFY), at most
until the approval's `expires_at` or the end of the wait; on PostgreSQL it also looks
again every `PG_POLL_SECONDS`, in case a notification was lost.
"""

from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import Response

from crew_server import models as m
from crew_server.api.http import Context, int_param, json_response, read_body
from crew_server.api.operation import Op
from crew_server.clock import parse_iso
from crew_server.errors import Invalid

MAX_WAIT_SECONDS = 30
PG_POLL_SECONDS = 1.0
STATES = ("pending", "allowed", "denied", "expired")


async def create_approval(ctx: Context, request: Request) -> Response:
    """An approval card for a running turn of the caller's connection (200: it existed)."""
    caller = ctx.connection(request)
    body = await read_body(request, m.ApprovalCreate)
    approval, created = ctx.store.create_approval(
        caller.computer_id,
        request.path_params["turn_id"],
        body.request_id,
        body.tool,
        body.patterns,
        body.always,
        body.summary,
    )
    return json_response(approval, 201 if created else 200)


async def wait_approval(ctx: Context, request: Request) -> Response:
    """The approval, once it is no longer pending or after `wait` seconds."""
    caller = ctx.connection(request)
    approval_id = request.path_params["approval_id"]
    wait = int_param(request, "wait", 0, 0, MAX_WAIT_SECONDS)
    approval = ctx.store.get_approval(approval_id, caller.computer_id)
    if approval["state"] != "pending" or wait == 0:
        return json_response(approval)
    flag = ctx.hub.subscribe(caller.computer_id)
    try:
        with anyio.move_on_after(wait):
            while approval["state"] == "pending" and not ctx.hub.closed:
                flag.clear()
                approval = ctx.store.get_approval(approval_id, caller.computer_id)
                if approval["state"] != "pending":
                    break
                # Wake at its expiry to expire it (the clock is the server's, maybe moved).
                left = (parse_iso(approval["expires_at"]) - ctx.clock.now()).total_seconds()
                timeout = max(0.0, left) + 0.01
                if ctx.store.dialect == "postgresql":
                    timeout = min(timeout, PG_POLL_SECONDS)
                with anyio.move_on_after(timeout):
                    await flag.wait()
        if approval["state"] == "pending":
            approval = ctx.store.get_approval(approval_id, caller.computer_id)
    finally:
        ctx.hub.unsubscribe(caller.computer_id, flag)
    return json_response(approval)


async def list_approvals(ctx: Context, request: Request) -> Response:
    """Approvals newest first, in one state when `state` is given."""
    ctx.user(request)
    state = request.query_params.get("state")
    if state is not None and state not in STATES:
        raise Invalid(f"state must be one of {', '.join(STATES)}, not {state[:40]!r}")
    limit = int_param(request, "limit", 100, 1, 1000)
    return json_response(ctx.store.list_approvals(state, limit))


async def get_approval(ctx: Context, request: Request) -> Response:
    """One approval."""
    ctx.user(request)
    return json_response(ctx.store.get_approval(request.path_params["approval_id"]))


async def answer_approval(ctx: Context, request: Request) -> Response:
    """The user's answer: once, always or deny."""
    ctx.user(request)
    body = await read_body(request, m.ApprovalDecide)
    answered = ctx.store.answer_approval(request.path_params["approval_id"], body.decision)
    return json_response(answered)


# The rows of the route table (`routes.OPS` joins them): the app serves them,
# `crew_server.openapi` documents them.
COMPUTER_OPS: list[Op] = [
    Op(
        "post",
        "/computer/turns/{turn_id}/approvals",
        "createApproval",
        "Ask the person about a tool call of this running turn: a card in the room of the "
        "newest message the turn claimed, waiting until `expires_at` (now + the agent's "
        "`permission.ask_timeout_s`). The same `request_id` for the same turn again answers "
        "the first approval (200). 409 `turn_over` when the turn is not running or was "
        "registered by an older connection.",
        "computer",
        m.ApprovalCreate,
        status=201,
        answer=m.Approval,
        extra={"200": m.Approval},
        handler=create_approval,
    ),
    Op(
        "get",
        "/computer/approvals/{approval_id}",
        "waitApproval",
        "An approval of this Computer's agents; with `wait` (0–30 s) a long poll: answers "
        "as soon as it is not `pending`, else after `wait` seconds (still pending). A pending "
        "approval past its `expires_at` is expired on read.",
        "computer",
        answer=m.Approval,
        query=(("wait", {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_SECONDS}),),
        handler=wait_approval,
    ),
]

USER_OPS: list[Op] = [
    Op(
        "get",
        "/api/approvals",
        "listApprovals",
        "Approvals, newest first (in one `state` when given).",
        "user",
        answer=m.Approval,
        many=True,
        query=(
            ("state", {"type": "string", "enum": list(STATES)}),
            ("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
        ),
        handler=list_approvals,
    ),
    Op(
        "get",
        "/api/approvals/{approval_id}",
        "getApproval",
        "One approval.",
        "user",
        answer=m.Approval,
        handler=get_approval,
    ),
    Op(
        "post",
        "/api/approvals/{approval_id}",
        "answerApproval",
        "Answer a pending approval: `once` (allowed this time), `always` (allowed, and an "
        "allow rule for what was asked is added to the agent's `permission`), `deny`. 409 "
        "`approval_closed` when it is not pending (already answered, expired, its turn ended).",
        "user",
        m.ApprovalDecide,
        answer=m.Approval,
        handler=answer_approval,
    ),
]
