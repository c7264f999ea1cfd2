"""The web app's pages (GET): rooms and their timelines, agents, turns, tasks, Computers.

Each view reads through the store's functions and renders one template; nothing
here writes except the user's read position when the newest page of a room is shown.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from crew_common.egress import MODES, EgressError, EgressPolicy
from crew_common.permissions import PRESET_MEANINGS
from crew_server import rules
from crew_server.errors import Invalid
from crew_server.store import USER
from crew_server.web.access import Web, see
from crew_server.web.render import page
from crew_server.web.room_status import room_status
from crew_server.web.session import Session
from crew_server.web.turn_events import folded_events

# Messages per page of a timeline: a room of any length opens with one page.
PAGE = 50
TURNS_SHOWN = 50
STATUSES = ("todo", "in_progress", "in_review", "done")
# What the agent form's egress select says of each mode (`crew_common.egress.MODES`).
EGRESS_TEXTS = {
    "public": "public: the public internet (default)",
    "open": "open: everything but this machine",
    "allow": "allow: only the hosts listed below",
    "none": "none: only the crew server and the model gateway",
}
EGRESS_MODES = [(mode, EGRESS_TEXTS[mode]) for mode in MODES]


def room_title(room: dict[str, Any]) -> str:
    """What a room is called: a group's title, a dm's agent, a thread's group."""
    if room["kind"] == "group":
        return str(room["title"])
    agents = [m["name"] for m in room["members"] if m["kind"] == "agent"]
    if room["kind"] == "dm":
        return agents[0] if agents else "Direct chat"
    return f"Thread in {room.get('parent_title') or 'a direct chat'}"


def rooms_nav(web: Web) -> list[dict[str, Any]]:
    """The rooms for the side list: id, title, kind, unread count, agents paused there."""
    unread = web.store.unread_by_user()
    return [
        {
            "id": r["id"],
            "title": room_title(r),
            "kind": r["kind"],
            "unread": unread.get(r["id"], 0),
            "paused": r["agents_paused"] is not None,
        }
        for r in web.store.list_rooms()
    ]


def agents_with_reasons(web: Web) -> list[dict[str, Any]]:
    """The roster: each agent with its status and, for an error, why, in plain words."""
    computers = {c["id"]: c for c in web.store.list_computers()}
    roster = []
    for agent in web.store.list_agents():
        latest = web.store.list_turns(agent["id"], 1)
        failure = latest[0]["failure"] if latest and latest[0]["status"] == "failed" else None
        reason = agent["problem"] or (
            f"{failure['class']}: {failure['reason']}" if failure is not None else None
        )
        status = "error" if agent["problem"] else agent["status"]
        computer = computers.get(agent["computer_id"] or "")
        roster.append(
            {
                **agent,
                "status": status,
                "reason": reason,
                "computer_name": computer["name"] if computer else None,
            }
        )
    return roster


def with_running_turn(web: Web, agent: dict[str, Any]) -> dict[str, Any]:
    """The agent with `running_turn_id`, the turn its Stop names (None: Wake is offered)."""
    return {**agent, "running_turn_id": web.store.running_turn_id(agent["id"])}


def egress_summary(egress: Any) -> str:
    """An agent's stored egress policy in one line (`EgressPolicy.summary`)."""
    try:
        return EgressPolicy.parse(egress).summary()
    except EgressError as exc:
        return f"unreadable ({exc})"


def known_models(web: Web) -> list[str]:
    """Every model a Computer reported, sorted."""
    return sorted({m for c in web.store.list_computers() for m in c["models"]})


def int_query(request: Request, name: str) -> int | None:
    """An optional positive integer query parameter."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 15:
        raise Invalid(f"{name} must be a positive integer")
    return int(raw)


async def home(web: Web, request: Request, session: Session) -> Response:
    """The start page is the rooms list."""
    return see("/rooms")


async def rooms(web: Web, request: Request, session: Session) -> Response:
    """Every room with its unread count, and the forms for a new dm or group."""
    context = {
        **web.base(session, "rooms", request),
        "rooms": rooms_nav(web),
        "agents": web.store.list_agents(),
    }
    return page(request, "rooms.html", context)


async def room(web: Web, request: Request, session: Session) -> Response:
    """One room: a page of its timeline, the thread beside it, tasks, members."""
    room_id = request.path_params["room_id"]
    shown = web.store.get_room(room_id)
    if shown["kind"] == "thread" and shown["parent_room_id"]:
        return see(f"/rooms/{shown['parent_room_id']}?thread={shown['root_message_id']}")
    before = int_query(request, "before")
    messages = web.store.list_messages_before(room_id, before, PAGE)
    newest = before is None
    last_seq = messages[-1]["seq"] if messages else 0
    if newest and last_seq:
        web.store.mark_read_by_user(room_id, last_seq)
    thread = None
    root_id = request.query_params.get("thread")
    if root_id and shown["kind"] == "group":
        root = web.store.get_message(root_id)
        if root["room_id"] != room_id:
            raise Invalid("that message is not in this room")
        thread_id = root["thread"]["id"] if root["thread"] else None
        replies = web.store.list_messages(thread_id, 0, 500) if thread_id else []
        thread = {
            "root": root,
            "id": thread_id,
            "messages": replies,
            "last_seq": replies[-1]["seq"] if replies else 0,
        }
    muted = web.store.muted_in(room_id)
    members = [{**m, "muted": m["id"] in muted} for m in shown["members"] if m["kind"] == "agent"]
    context = {
        **web.base(session, "rooms", request),
        "room": shown,
        "title": room_title(shown),
        "rooms": rooms_nav(web),
        "messages": messages,
        "older": messages[0]["seq"] if messages and messages[0]["seq"] > 1 else None,
        "newest": newest,
        "last_seq": last_seq,
        "thread": thread,
        "members": members,
        "handles": [m["handle"] for m in members],
        "tasks": web.store.list_tasks(USER, room_id),
        "statuses": STATUSES,
        "status": room_status(web, room_id),
        **room_settings(web, shown),
    }
    return page(request, "room.html", context)


def room_settings(web: Web, shown: dict[str, Any]) -> dict[str, Any]:
    """What the room's settings (`_room_settings.html`) need: every agent, the members."""
    return {
        "all_agents": web.store.list_agents() if shown["kind"] == "group" else [],
        "member_ids": {m["id"] for m in shown["members"] if m["kind"] == "agent"},
    }


async def agents(web: Web, request: Request, session: Session) -> Response:
    """The roster with live status, and the form for a new agent."""
    context = {
        **web.base(session, "agents", request),
        "roster": agents_with_reasons(web),
        "computers": web.store.list_computers(),
        "models": known_models(web),
        "egress_modes": EGRESS_MODES,
        "permission_presets": list(PRESET_MEANINGS.items()),
    }
    return page(request, "agents.html", context)


def capabilities_form(document: dict[str, Any]) -> dict[str, Any]:
    """What the agent page's capabilities form shows of a document as the user sees it
    (secrets "(set)"): the MCP servers as JSON, each skill's fields, one blank skill to add."""
    skills = [
        {
            "name": skill["name"],
            "description": skill["description"],
            "body": skill["body"],
            "files": orjson.dumps(skill["files"], option=orjson.OPT_INDENT_2).decode()
            if skill["files"]
            else "",
        }
        for skill in document["skills"]
    ]
    servers = document["mcp_servers"]
    return {
        "mcp_servers": orjson.dumps(servers, option=orjson.OPT_INDENT_2).decode()
        if servers
        else "",
        "skills": [*skills, {"name": "", "description": "", "body": "", "files": ""}],
    }


async def agent(web: Web, request: Request, session: Session) -> Response:
    """One agent: status, settings (editable), its turns newest first, its reminders."""
    return agent_page(web, request, session, request.path_params["agent_id"])


def agent_page(
    web: Web,
    request: Request,
    session: Session,
    agent_id: str,
    capabilities: dict[str, Any] | None = None,
    capabilities_error: str | None = None,
) -> Response:
    """The agent page; after a refused capabilities form (`capabilities_error`, 422) with
    what the person sent (`capabilities`, as `capabilities_form` gives) kept in the form."""
    web.store.get_agent(agent_id)
    shown = with_running_turn(web, next(a for a in agents_with_reasons(web) if a["id"] == agent_id))
    if capabilities is None:
        capabilities = capabilities_form(web.store.agent_capabilities(agent_id))
    context = {
        **web.base(session, "agents", request),
        # The page's forms come back here, also when a refused post rendered it.
        "here": f"/agents/{agent_id}",
        "capabilities": capabilities,
        "capabilities_error": capabilities_error,
        "capabilities_state": web.store.capabilities_state(agent_id),
        "agent": shown,
        "turns": web.store.list_turns(agent_id, TURNS_SHOWN),
        "reminders": web.store.list_reminders(agent_id),
        "computers": web.store.list_computers(),
        "models": known_models(web),
        "egress_modes": EGRESS_MODES,
        "permission_presets": list(PRESET_MEANINGS.items()),
        "egress": egress_summary(shown["egress"]),
    }
    return page(request, "agent.html", context, 422 if capabilities_error else 200)


async def turn(web: Web, request: Request, session: Session) -> Response:
    """One turn: input, events (steps, text, tool calls), result, usage, cost."""
    shown = web.store.get_turn(request.path_params["turn_id"])
    # Each tool call once, where it began: finished, running, or cut short.
    listed = folded_events(shown["events"], running=shown["status"] == "running")
    context = {
        **web.base(session, "agents", request),
        "turn": {**shown, "events": listed},
        "agent": web.store.get_agent(shown["agent_id"]),
        "next_index": shown["events"][-1]["index"] + 1 if shown["events"] else 0,
        "cost": turn_cost(shown),
    }
    return page(request, "turn.html", context)


def turn_cost(shown: dict[str, Any]) -> dict[str, float]:
    """The turn's usage: its recorded totals, or (while running) summed from its steps."""
    if shown.get("usage"):
        return dict(shown["usage"])
    return rules.usage_from_events(shown.get("events", []))


async def tasks(web: Web, request: Request, session: Session) -> Response:
    """Every task, and every agent's reminders."""
    roster = web.store.list_agents()
    reminders = [
        {**r, "handle": a["handle"]} for a in roster for r in web.store.list_reminders(a["id"])
    ]
    rooms = {r["id"]: r["title"] for r in rooms_nav(web)}
    context = {
        **web.base(session, "tasks", request),
        "tasks": web.store.list_tasks(USER, None),
        "room_titles": rooms,
        "reminders": reminders,
        "statuses": STATUSES,
    }
    return page(request, "tasks.html", context)


async def computers(web: Web, request: Request, session: Session) -> Response:
    """The Computers with what they reported, and the form for a new one."""
    return computers_page(web, request, session, None)


def computers_page(
    web: Web, request: Request, session: Session, created: dict[str, str] | None
) -> Response:
    """The Computers page; `created` (a new Computer with its token) is shown only once."""
    listening = web.ctx.hub.listening()
    context = {
        **web.base(session, "computers", request),
        "computers": [{**c, "connected": c["id"] in listening} for c in web.store.list_computers()],
        "created": created,
        # The configured URL, never the request's Host (a client chooses that).
        "server_url": web.ctx.public_url or str(request.base_url).rstrip("/"),
    }
    return page(request, "computers.html", context, 201 if created else 200)


# ---------------------------------------------------------------- confirmations (issue 25)


def plural(count: int, one: str, many: str | None = None) -> str:
    """`1 message`, `3 messages`."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


def confirm_page(
    web: Web,
    request: Request,
    session: Session,
    section: str,
    texts: dict[str, Any],
) -> Response:
    """The page a destructive link leads to: what goes, and the one form that does it."""
    context = {**web.base(session, section, request), **texts}
    return page(request, "confirm.html", context)


async def confirm_agent_delete(web: Web, request: Request, session: Session) -> Response:
    """ "Delete Ada?" with what goes with her, and the form that deletes."""
    agent_id = request.path_params["agent_id"]
    shown = web.store.get_agent(agent_id)
    counts = web.store.removal_preview("agent", agent_id)
    name = shown["name"]
    consequences = [
        f"{name}'s direct chat goes, with its {plural(counts['dm_messages'], 'message')}."
        if counts["dms"]
        else "",
        f"{name} leaves {plural(counts['groups'], 'group')}; what {name} wrote there stays, "
        f"signed “{name} (deleted)”."
        if counts["groups"]
        else "",
        f"{name}'s {plural(counts['reminders'], 'reminder')} go." if counts["reminders"] else "",
        f"{plural(counts['tasks'], 'task')} assigned to {name} become unassigned."
        if counts["tasks"]
        else "",
        f"{name}'s tokens stop working; a turn running now is stopped.",
        f"The handle @{shown['handle']} is free again.",
    ]
    return confirm_page(
        web,
        request,
        session,
        "agents",
        {
            "question": f"Delete {name} (@{shown['handle']})?",
            "consequences": [line for line in consequences if line],
            "action": f"/agents/{agent_id}/delete",
            "button": f"Delete {name}",
            "cancel": f"/agents/{agent_id}",
        },
    )


async def confirm_room_delete(web: Web, request: Request, session: Session) -> Response:
    """ "Delete the group Crew?" with what goes with it, and the form that deletes."""
    room_id = request.path_params["room_id"]
    shown = web.store.get_room(room_id)
    if shown["kind"] == "thread":
        raise Invalid("a thread goes with its group: delete the group")
    counts = web.store.removal_preview("room", room_id)
    title = room_title(shown)
    what = "the group" if shown["kind"] == "group" else "the direct chat with"
    consequences = [
        f"Its {plural(counts['messages'], 'message')}, {plural(counts['threads'], 'thread')} "
        f"and {plural(counts['tasks'], 'task')} go.",
        "Its agents stay (they are no longer woken here).",
    ]
    return confirm_page(
        web,
        request,
        session,
        "rooms",
        {
            "question": f"Delete {what} {title}?",
            "consequences": consequences,
            "action": f"/rooms/{room_id}/delete",
            "button": "Delete the room",
            "cancel": f"/rooms/{room_id}",
        },
    )


async def confirm_computer_delete(web: Web, request: Request, session: Session) -> Response:
    """ "Delete the Computer box?" with what it means, and the form that deletes."""
    computer_id = request.path_params["computer_id"]
    counts = web.store.removal_preview("computer", computer_id)
    name = next(c["name"] for c in web.store.list_computers() if c["id"] == computer_id)
    consequences = [
        "Its token is revoked at once: a crew-computer running with it stops, saying so.",
        f"Its {plural(counts['agents'], 'agent')} stay, without a Computer: choose another "
        "one on each agent's page.",
        "Turns running there now end as interrupted; unanswered messages wait.",
    ]
    return confirm_page(
        web,
        request,
        session,
        "computers",
        {
            "question": f"Delete the Computer {name}?",
            "consequences": consequences,
            "action": f"/computers/{computer_id}/delete",
            "button": f"Delete {name}",
            "cancel": "/computers",
        },
    )
