"""The web app's form posts: sign-in and out, rooms, messages, agents, mutes, tasks,
Computers.

Every action here runs behind `access.form_action` (session and CSRF checked). The
requests are validated with the API's own pydantic models and carried out by the
same store functions the user API calls, so a rule (a taken handle, an unknown
model, a dm with one agent) lives once and reads the same in the browser.
"""

from __future__ import annotations

from typing import Any, TypeVar
from urllib.parse import quote

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from crew_server import models as m
from crew_server.api.user import heard_by_its_computer
from crew_server.errors import ApiError, Invalid, InvalidCapabilities, TooLarge
from crew_server.store import USER
from crew_server.web.access import ANONYMOUS_BODY, Form, Web, back_to, read_form, refusal, see
from crew_server.web.render import SECURITY_HEADERS, page
from crew_server.web.session import (
    SESSION_COOKIE,
    SESSION_SECONDS,
    SIGN_IN_COOKIE,
    SIGN_IN_SECONDS,
    Session,
    set_cookie,
)
from crew_server.web.streams import CLIENT_IDS
from crew_server.web.views import agent_page, computers_page, room_title

M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], data: dict[str, Any]) -> M:
    """`data` checked by the API's request model; `Invalid` (422) says what is wrong."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'form'}: {err['msg']}"
            for err in exc.errors(include_url=False)[:5]
        )
        raise Invalid(f"the form is invalid: {problems}") from exc


def safe_next(target: str) -> str:
    """Where to go after signing in: a path of this site, else the rooms."""
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/rooms"


# ---------------------------------------------------------------- sign-in


async def sign_in_form(web: Web, request: Request) -> Response:
    """The sign-in form, with a one-time token bound to a pre-session cookie."""
    if web.sessions.of(request) is not None:
        return see(safe_next(request.query_params.get("next", "/rooms")))
    token = web.sessions.new_sign_in()
    context = {"sign_in": token, "next": safe_next(request.query_params.get("next", "/rooms"))}
    response = page(request, "login.html", {**context, "error": None})
    set_cookie(response, SIGN_IN_COOKIE, token, SIGN_IN_SECONDS)
    return response


async def sign_in(web: Web, request: Request) -> Response:
    """The user token, or a sign-in link's one-time code, for a session cookie; a wrong
    one shows the form again (401)."""
    try:
        form = await read_form(request, ANONYMOUS_BODY)
    except TooLarge as exc:
        return refusal(request, exc.status, f"Not signed in: {exc.message}.")
    target = safe_next(form.get("next", "/rooms"))
    if not web.sessions.use_sign_in(form.get("sign_in"), request.cookies.get(SIGN_IN_COOKIE, "")):
        return see(f"/login?next={quote(target, safe='')}")
    code = form.get("code").strip()
    if code:
        if not web.ctx.sign_in_codes.redeem(code):
            return sign_in_again(
                web,
                request,
                target,
                "This sign-in link was used already or is over 10 minutes old. Sign in with "
                "the user token, or ask for a new link (POST /api/sign-in-codes).",
            )
    elif not web.store.check_user_token(form.get("token").strip()):
        return sign_in_again(
            web,
            request,
            target,
            "That is not the user token. Use the token crew-server printed at first start.",
        )
    session = web.sessions.start()
    response = see(target)
    set_cookie(response, SESSION_COOKIE, session.session_id, SESSION_SECONDS)
    response.delete_cookie(SIGN_IN_COOKIE, path="/")
    return response


def sign_in_again(web: Web, request: Request, target: str, error: str) -> Response:
    """The sign-in form again (401), saying why the last try failed."""
    token = web.sessions.new_sign_in()
    response = page(request, "login.html", {"sign_in": token, "next": target, "error": error}, 401)
    set_cookie(response, SIGN_IN_COOKIE, token, SIGN_IN_SECONDS)
    return response


async def sign_out(web: Web, request: Request, session: Session, form: Form) -> Response:
    """End the session; the browser is back at the sign-in form."""
    web.sessions.end(session)
    web.live.changed()  # its live streams say `signed-out` now
    response = see("/login")
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


# ---------------------------------------------------------------- rooms and messages


async def create_room(web: Web, request: Request, session: Session, form: Form) -> Response:
    """A dm with one agent (the existing one when there is) or a group with several."""
    kind = form.get("kind")
    agent_ids = form.all("agent_id") if kind == "group" else [form.get("agent_id")]
    body = validated(
        m.RoomCreate,
        {"kind": kind, "title": form.optional("title"), "agent_ids": [a for a in agent_ids if a]},
    )
    if not body.agent_ids:
        raise Invalid("choose at least one agent")
    created, _ = web.store.create_room(body.kind, body.title, body.agent_ids)
    return see(f"/rooms/{created['id']}")


async def post_message(web: Web, request: Request, session: Session, form: Form) -> Response:
    """The user posts in the room (or in the thread of `thread_of`)."""
    room_id = request.path_params["room_id"]
    body = validated(
        m.MessageCreate, {"body": form.get("body"), "thread_of": form.optional("thread_of")}
    )
    client_id = CLIENT_IDS.checked(form.get("client_id"))
    message = web.store.user_post(room_id, body.body, body.thread_of)
    if client_id:
        # The page shows it as pending; the stream's fragment says which one it is.
        CLIENT_IDS.remember(message["id"], client_id)
    if request.headers.get("x-crew-fetch"):
        # The page's script sent it; the live stream shows the message.
        return JSONResponse({"id": message["id"], "seq": message["seq"]}, headers=SECURITY_HEADERS)
    return see(back_to(form, f"/rooms/{room_id}"))


async def mute(web: Web, request: Request, session: Session, form: Form) -> Response:
    """Mute or unmute an agent in a group."""
    room_id = request.path_params["room_id"]
    agent_id = form.get("agent_id")
    if form.get("action") == "unmute":
        web.store.unmute(agent_id, room_id)
    else:
        web.store.mute_for_agent(agent_id, room_id)
    return see(back_to(form, f"/rooms/{room_id}"))


def form_int(text: str) -> int | str:
    """A number field's text as an integer (else as it is, for the model to refuse)."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) < 10 else text


async def loop_guard(web: Web, request: Request, session: Session, form: Form) -> Response:
    """Change a room's loop guard (as PATCH /api/rooms/{id})."""
    room_id = request.path_params["room_id"]
    body = validated(
        m.RoomPatch,
        {
            "agent_hop_limit": form_int(form.get("agent_hop_limit")),
            "agent_rate_limit": form_int(form.get("agent_rate_limit")),
        },
    )
    web.store.set_loop_limits(room_id, body.agent_hop_limit, body.agent_rate_limit)
    return see(back_to(form, f"/rooms/{room_id}"))


async def dismiss_status(web: Web, request: Request, session: Session, form: Form) -> Response:
    """Dismiss an agent's failure line under a room's timeline (issue 25), at the failed
    turn it showed: it stays away until a later turn fails there."""
    room_id = request.path_params["room_id"]
    agent_id, turn_id = form.get("agent_id").strip(), form.get("turn_id").strip()
    if not agent_id or not turn_id:
        raise Invalid("the form needs the agent_id and turn_id of the failure to dismiss")
    web.store.dismiss_room_failure(room_id, agent_id, turn_id)
    return see(back_to(form, f"/rooms/{room_id}"))


# ---------------------------------------------------------------- agents


BUDGET_FIELDS = {
    "daily_usd": "budget_daily_usd",
    "monthly_usd": "budget_monthly_usd",
    "monthly_tokens": "budget_monthly_tokens",
}


def budget_number(text: str | None) -> Any:
    """A budget box: blank is no cap, a number is the cap; anything else is passed on as
    typed, for the store to refuse with its reason."""
    if text is None:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def budget_fields(form: Form) -> dict[str, Any]:
    """The budget boxes as the API's `budget` (absent when the form has none of them)."""
    if not any(form.all(name) for name in BUDGET_FIELDS.values()):
        return {}
    return {"budget": {cap: budget_number(form.optional(f)) for cap, f in BUDGET_FIELDS.items()}}


def permission_field(form: Form) -> dict[str, Any]:
    """The agent form's permission policy (issue 24), when the form has it: a preset, the
    rules one per line as `tool pattern action` (the pattern may hold spaces; removing a
    line removes the rule) and the ask timeout. `crew_common.permissions` checks it."""
    if not form.get("permission_preset"):
        return {}
    rules: list[dict[str, str]] = []
    for line in form.get("permission_rules").splitlines():
        words = line.split()
        if not words:
            continue
        if len(words) < 3:
            raise Invalid(
                f"the permission rule {line.strip()!r} is not `tool pattern action` "
                "(e.g. `bash git push * ask`)"
            )
        rules.append({"tool": words[0], "pattern": " ".join(words[1:-1]), "action": words[-1]})
    timeout = form.get("permission_ask_timeout_s").strip()
    if timeout and not (timeout.isascii() and timeout.isdigit() and len(timeout) <= 9):
        raise Invalid("the ask timeout is a whole number of seconds, like 600")
    policy: dict[str, Any] = {"preset": form.get("permission_preset"), "rules": rules}
    if timeout:
        policy["ask_timeout_s"] = int(timeout)
    return {"permission": policy}


def agent_fields(form: Form) -> dict[str, Any]:
    """The agent form's fields as the API's request body (a blank Computer is none; the
    egress rules are the non-blank lines of their text box; a blank budget box no cap)."""
    rules = [line.strip() for line in form.get("egress_allow").splitlines() if line.strip()]
    return {
        "name": form.get("name"),
        "persona": form.get("persona"),
        "model": form.get("model").strip(),
        "computer_id": form.optional("computer_id"),
        "egress": {"mode": form.get("egress_mode", "public"), "allow": rules},
        **budget_fields(form),
        **permission_field(form),
    }


async def create_agent(web: Web, request: Request, session: Session, form: Form) -> Response:
    """A new agent, through the user API's request model and store function."""
    body = validated(m.AgentCreate, {"handle": form.get("handle").strip(), **agent_fields(form)})
    created = web.store.create_agent(
        body.handle,
        body.name,
        body.persona,
        body.model,
        body.engine,
        body.computer_id,
        egress=body.egress.model_dump() if body.egress else None,
        budget=body.budget,
        permission=body.permission,
    )
    note_warnings(web, session, created)
    return see(f"/agents/{created['id']}")


def note_warnings(web: Web, session: Session, saved: dict[str, Any]) -> None:
    """What the store said about a saved agent (e.g. its model could not be checked yet)."""
    warnings = saved.get("warnings") or []
    if warnings:
        web.flashes[session.session_id] = " ".join(str(w) for w in warnings)


async def edit_agent(web: Web, request: Request, session: Session, form: Form) -> Response:
    """Change an agent's name, persona, model, Computer or egress policy (as PATCH
    /api/agents/{id})."""
    agent_id = request.path_params["agent_id"]
    body = validated(m.AgentPatch, agent_fields(form))
    changes = {
        k: v
        for k, v in body.model_dump(exclude_unset=True).items()
        if v is not None or k == "computer_id"
    }
    note_warnings(web, session, web.store.update_agent(agent_id, changes))
    return see(f"/agents/{agent_id}")


def capabilities_fields(form: Form) -> dict[str, Any]:
    """The capabilities form as sent, in the shape `views.capabilities_form` shows (so a
    refused one comes back as it was typed)."""
    names, descriptions = form.all("skill_name"), form.all("skill_description")
    bodies, files = form.all("skill_body"), form.all("skill_files")
    count = max(len(names), len(descriptions), len(bodies), len(files))

    def nth(values: list[str], i: int) -> str:
        return values[i] if i < len(values) else ""

    skills = [
        {
            "name": nth(names, i),
            "description": nth(descriptions, i),
            "body": nth(bodies, i),
            "files": nth(files, i),
        }
        for i in range(count)
    ]
    if not skills or any(skills[-1].values()):
        skills.append({"name": "", "description": "", "body": "", "files": ""})
    return {"mcp_servers": form.get("mcp_servers"), "skills": skills}


def json_box(text: str, what: str, empty: Any) -> Any:
    """A JSON text box's value (blank: `empty`); `InvalidCapabilities` with where it broke."""
    if not text.strip():
        return empty
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidCapabilities(
            f"the capabilities are invalid: {what} is not JSON ({exc}); "
            'write a JSON list such as [{"type": "local", "name": "notes", "command": '
            '["python3", "notes.py"]}], or leave it blank'
            if what == "MCP servers"
            else f"the capabilities are invalid: {what} is not JSON ({exc}); write a JSON "
            'object of relative path to text, such as {"templates/a.md": "..."}, or leave it '
            "blank"
        ) from exc


def capabilities_document(fields: dict[str, Any]) -> dict[str, Any]:
    """The document the store checks, from `capabilities_fields` (a skill with every
    field blank is none: that is how one is removed, or the blank one left unused)."""
    skills = []
    for i, skill in enumerate(fields["skills"], start=1):
        if not any(value.strip() for value in skill.values()):
            continue
        skills.append(
            {
                "name": skill["name"].strip(),
                "description": skill["description"].strip(),
                # Browsers send CRLF line ends; the skill's Markdown has LF ones.
                "body": skill["body"].replace("\r\n", "\n"),
                "files": json_box(skill["files"], f"skill {i}'s files", {}),
            }
        )
    servers = json_box(fields["mcp_servers"], "MCP servers", [])
    return {"mcp_servers": servers, "skills": skills}


async def set_capabilities(web: Web, request: Request, session: Session, form: Form) -> Response:
    """Replace an agent's MCP servers and skills (as PUT /api/agents/{id}/capabilities);
    refused, the page comes back with the reason and the form as it was sent."""
    agent_id = request.path_params["agent_id"]
    fields = capabilities_fields(form)
    try:
        web.store.set_capabilities(agent_id, capabilities_document(fields))
    except ApiError as exc:
        if exc.status != 422:
            raise
        return agent_page(web, request, session, agent_id, fields, exc.message)
    return see(f"/agents/{agent_id}#capabilities-title")


async def resume_budget(web: Web, request: Request, session: Session, form: Form) -> Response:
    """Resume an agent held by its budget once (as POST /api/agents/{id}/budget/resume)."""
    agent_id = request.path_params["agent_id"]
    web.store.resume_budget(agent_id)
    return see(f"/agents/{agent_id}")


async def stop_turn(web: Web, request: Request, session: Session, form: Form) -> Response:
    """A person's Stop of the agent's running turn `turn_id` (as POST
    /api/agents/{id}/stop; the form asked first)."""
    agent_id = request.path_params["agent_id"]
    body = validated(m.StopTurn, {"turn_id": form.get("turn_id")})
    heard_by_its_computer(web.ctx, agent_id)
    web.store.stop_turn(agent_id, body.turn_id)
    return see(back_to(form, f"/agents/{agent_id}"))


async def wake_agent(web: Web, request: Request, session: Session, form: Form) -> Response:
    """A person's Wake: a turn now for the agent's unread messages (as POST
    /api/agents/{id}/wake)."""
    agent_id = request.path_params["agent_id"]
    heard_by_its_computer(web.ctx, agent_id)
    web.store.wake_now(agent_id)
    return see(back_to(form, f"/agents/{agent_id}"))


# ---------------------------------------------------------------- tasks


async def create_task(web: Web, request: Request, session: Session, form: Form) -> Response:
    """A task in a room, as the user."""
    body = validated(
        m.TaskCreate,
        {
            "room_id": form.get("room_id"),
            "title": form.get("title"),
            "assignee": form.optional("assignee"),
        },
    )
    web.store.create_task(USER, body.room_id, body.title, body.assignee)
    return see(back_to(form, f"/rooms/{body.room_id}"))


async def convert_task(web: Web, request: Request, session: Session, form: Form) -> Response:
    """Make a message a task, as the user."""
    body = validated(
        m.TaskConvert,
        {"message_id": form.get("message_id"), "assignee": form.optional("assignee")},
    )
    web.store.convert_task(USER, body.message_id, body.assignee)
    return see(back_to(form, "/tasks"))


def task_number(request: Request) -> int:
    raw = request.path_params["number"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 15:
        raise Invalid("the task number must be a positive integer, like 3")
    return int(raw)


async def task_status(web: Web, request: Request, session: Session, form: Form) -> Response:
    """Move a task to another status."""
    body = validated(m.TaskStatusSet, {"status": form.get("status")})
    web.store.set_task_status(USER, task_number(request), body.status, None, None)
    return see(back_to(form, "/tasks"))


async def assign_task(web: Web, request: Request, session: Session, form: Form) -> Response:
    """Give a task to an agent of its room."""
    body = validated(m.TaskAssign, {"assignee": form.get("assignee").strip()})
    web.store.assign_task(USER, task_number(request), body.assignee, None)
    return see(back_to(form, "/tasks"))


# ---------------------------------------------------------------- computers


async def create_computer(web: Web, request: Request, session: Session, form: Form) -> Response:
    """A new Computer: its token is shown on this answer only, with the line to paste."""
    body = validated(m.ComputerCreate, {"name": form.get("name")})
    computer_id, token = web.store.create_computer(body.name)
    created = {"id": computer_id, "name": body.name, "token": token}
    return computers_page(web, request, session, created)


# ---------------------------------------------------------------- approvals (issue 24)


async def answer_approval(web: Web, request: Request, session: Session, form: Form) -> Response:
    """The person answers an approval card: Allow once, Always, Deny (`ApprovalDecide`)."""
    body = validated(m.ApprovalDecide, {"decision": form.get("decision")})
    web.store.answer_approval(request.path_params["approval_id"], body.decision)
    return see(back_to(form, "/rooms"))


# ---------------------------------------------------------------- removals (issue 25)


async def rename_room(web: Web, request: Request, session: Session, form: Form) -> Response:
    """Rename a group (as PATCH /api/rooms/{id} with `title`)."""
    room_id = request.path_params["room_id"]
    body = validated(m.RoomPatch, {"title": form.get("title")})
    web.store.update_room(room_id, body.title, None)
    return see(back_to(form, f"/rooms/{room_id}"))


async def set_members(web: Web, request: Request, session: Session, form: Form) -> Response:
    """Make the checked agents the group's (as PATCH /api/rooms/{id} with `agent_ids`)."""
    room_id = request.path_params["room_id"]
    body = validated(m.RoomPatch, {"agent_ids": [a for a in form.all("agent_id") if a]})
    web.store.update_room(room_id, None, body.agent_ids)
    return see(back_to(form, f"/rooms/{room_id}"))


async def delete_agent(web: Web, request: Request, session: Session, form: Form) -> Response:
    """Delete an agent (the confirmation page's form; as DELETE /api/agents/{id})."""
    agent = web.store.get_agent(request.path_params["agent_id"])
    web.store.delete_agent(agent["id"])
    web.flashes[session.session_id] = f"{agent['name']} (@{agent['handle']}) was deleted."
    return see("/agents")


async def delete_room(web: Web, request: Request, session: Session, form: Form) -> Response:
    """Delete a dm or a group (the confirmation page's form; as DELETE /api/rooms/{id})."""
    room = web.store.get_room(request.path_params["room_id"])
    web.store.delete_room(room["id"])
    web.flashes[session.session_id] = f"{room_title(room)} was deleted."
    return see("/rooms")


async def delete_computer(web: Web, request: Request, session: Session, form: Form) -> Response:
    """Delete a Computer, revoking its token (the confirmation page's form; as DELETE
    /api/computers/{id})."""
    computer_id = request.path_params["computer_id"]
    name = next((c["name"] for c in web.store.list_computers() if c["id"] == computer_id), None)
    web.store.delete_computer(computer_id)
    web.flashes[session.session_id] = f"The Computer {name} was deleted; its token is revoked."
    return see("/computers")
