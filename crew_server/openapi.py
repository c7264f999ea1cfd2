"""Build `openapi/upstream.yaml` (OpenAPI 3.1) from the pydantic models in `crew_server.models`.

`python -m crew_server.openapi > openapi/upstream.yaml` regenerates it; a test
checks the committed file is what this module builds, and schemathesis checks
the app against it. The operation table below is the API at a glance.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from crew_server import models as m

_UUID = {"type": "string", "format": "uuid"}
_ERRORS = {
    "400": "The body is not JSON.",
    "401": "Missing or invalid bearer token.",
    "403": "Not allowed (e.g. not a member of that room).",
    "404": "No such object (or not visible to this caller).",
    "409": "Refused (`refused`), a stale fence (`stale_turn`), a conflict.",
    "413": "The body is over 1 MiB.",
    "422": "The body or a parameter is invalid.",
}


@dataclass(frozen=True)
class Op:
    """One operation: who calls it, what it takes, what it answers."""

    method: str
    path: str
    op_id: str
    summary: str
    auth: str  # "user" | "computer" | "agent" | "none"
    body: type[BaseModel] | None = None
    status: int = 200
    answer: type[BaseModel] | None = None
    many: bool = False
    query: tuple[tuple[str, dict[str, Any]], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


_SEQ = {"type": "integer", "minimum": 0, "maximum": 2**53}
OPS: list[Op] = [
    Op("get", "/health", "health", "The server answers.", "none", answer=m.Health),
    # ------------------------------------------------------------ the Computer
    Op(
        "post",
        "/computer/connect",
        "connect",
        "Confirm the credential; get a new connection epoch (older running turns become interrupted).",
        "computer",
        m.Connect,
        answer=m.ConnectAnswer,
    ),
    Op(
        "get",
        "/computer/events",
        "computerEvents",
        "SSE: `wake` {agent_id}, `agents` {agent_id}, `ping` {} every 15 s; `id:` on every event; "
        "send `Last-Event-ID` to replay what was missed.",
        "computer",
    ),
    Op(
        "get",
        "/computer/agents",
        "computerAgents",
        "The agents assigned to this Computer.",
        "computer",
        answer=m.Agent,
        many=True,
    ),
    Op(
        "put",
        "/computer/models",
        "putModels",
        "The models this Computer can run.",
        "computer",
        m.ModelsPut,
        status=204,
    ),
    Op(
        "put",
        "/computer/agents/{agent_id}/problem",
        "putProblem",
        "Why this agent cannot run.",
        "computer",
        m.ProblemPut,
        status=204,
    ),
    Op(
        "delete",
        "/computer/agents/{agent_id}/problem",
        "deleteProblem",
        "The agent can run again.",
        "computer",
        status=204,
    ),
    Op(
        "post",
        "/computer/agents/{agent_id}/token",
        "agentToken",
        "A new agent token; older ones stay valid until the Computer reconnects.",
        "computer",
        answer=m.TokenAnswer,
    ),
    Op(
        "post",
        "/computer/agents/{agent_id}/unread",
        "claimUnread",
        "Unread messages by room (after the read position); marks them delivered.",
        "computer",
        answer=m.UnreadAnswer,
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
    ),
    Op(
        "post",
        "/computer/agents/{agent_id}/ack",
        "ack",
        "The turn handled its messages: read := delivered.",
        "computer",
        m.Ack,
        status=204,
    ),
    Op(
        "post",
        "/computer/turns/{turn_id}/events",
        "turnEvents",
        "A batch of engine events from `first_index`; a jump leaves a recorded gap.",
        "computer",
        m.EventsBatch,
        status=204,
    ),
    Op(
        "post",
        "/computer/turns/{turn_id}/finish",
        "finishTurn",
        "The turn's result and usage.",
        "computer",
        m.TurnFinish,
        status=204,
    ),
    # ------------------------------------------------------------ agents (crew)
    Op(
        "post",
        "/agent/reply",
        "reply",
        "Post a reply (in the thread of `thread_of` when given). 409 `held` when the agent has "
        "not seen newer messages there: nothing is posted and they are now delivered.",
        "agent",
        m.Reply,
        status=201,
        answer=m.ReplyAnswer,
    ),
    Op(
        "get",
        "/agent/tasks",
        "agentTasks",
        "Tasks of a room (a thread stands for its group).",
        "agent",
        answer=m.Task,
        many=True,
        query=(("room_id", _UUID),),
    ),
    Op(
        "post",
        "/agent/tasks",
        "agentCreateTask",
        "A task hosted on a new message.",
        "agent",
        m.TaskCreate,
        status=201,
        answer=m.Task,
    ),
    Op(
        "post",
        "/agent/tasks/convert",
        "agentConvertTask",
        "Make a message a task.",
        "agent",
        m.TaskConvert,
        status=201,
        answer=m.Task,
    ),
    Op(
        "post",
        "/agent/tasks/{number}/claim",
        "agentClaimTask",
        "Take the task (refused when someone else holds it).",
        "agent",
        answer=m.Task,
    ),
    Op(
        "post",
        "/agent/tasks/{number}/status",
        "agentTaskStatus",
        "Move the task (assignee only); the note goes into the notice.",
        "agent",
        m.TaskStatusSet,
        answer=m.Task,
    ),
    Op(
        "post",
        "/agent/tasks/{number}/assign",
        "agentAssignTask",
        "Hand the task over (when unassigned or held by the caller).",
        "agent",
        m.TaskAssign,
        answer=m.Task,
    ),
    Op(
        "post",
        "/agent/reminders",
        "createReminder",
        "A reminder to itself.",
        "agent",
        m.ReminderCreate,
        status=201,
        answer=m.Reminder,
    ),
    Op(
        "get",
        "/agent/reminders",
        "listReminders",
        "The caller's reminders.",
        "agent",
        answer=m.Reminder,
        many=True,
    ),
    Op(
        "delete",
        "/agent/reminders/{reminder_id}",
        "deleteReminder",
        "Cancel a reminder.",
        "agent",
        status=204,
    ),
    Op(
        "put",
        "/agent/mutes/{room_id}",
        "mute",
        "Mute a group (15 minutes to 7 days, or until unmuted); @mentions still wake.",
        "agent",
        m.MuteSet,
        answer=m.MuteAnswer,
    ),
    Op("delete", "/agent/mutes/{room_id}", "unmute", "Unmute (wakes nobody).", "agent", status=204),
    # ------------------------------------------------------------ the user
    Op(
        "post",
        "/api/computers",
        "createComputer",
        "A Computer credential (token shown once).",
        "user",
        m.ComputerCreate,
        status=201,
        answer=m.ComputerCreated,
    ),
    Op(
        "get",
        "/api/computers",
        "listComputers",
        "Computers and what they reported.",
        "user",
        answer=m.ComputerInfo,
        many=True,
    ),
    Op(
        "post",
        "/api/agents",
        "createAgent",
        "A new agent (its Computer gets `agents`).",
        "user",
        m.AgentCreate,
        status=201,
        answer=m.Agent,
    ),
    Op(
        "get",
        "/api/agents",
        "listAgents",
        "Agents with status (from turns) and problem.",
        "user",
        answer=m.AgentWithStatus,
        many=True,
    ),
    Op(
        "patch",
        "/api/agents/{agent_id}",
        "patchAgent",
        "Change settings (its Computer, old and new, gets `agents`).",
        "user",
        m.AgentPatch,
        answer=m.Agent,
    ),
    Op(
        "get",
        "/api/agents/{agent_id}/positions",
        "agentPositions",
        "Delivered and read positions per room.",
        "user",
        answer=m.Position,
        many=True,
    ),
    Op(
        "delete",
        "/api/agents/{agent_id}/mutes/{room_id}",
        "userUnmute",
        "The user unmutes an agent (wakes nobody).",
        "user",
        status=204,
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
    ),
    Op("get", "/api/rooms", "listRooms", "Dms and groups.", "user", answer=m.Room, many=True),
    Op("get", "/api/rooms/{room_id}", "getRoom", "One room (threads too).", "user", answer=m.Room),
    Op(
        "post",
        "/api/rooms/{room_id}/messages",
        "postMessage",
        "The user posts (in the thread of `thread_of`, created when missing).",
        "user",
        m.MessageCreate,
        status=201,
        answer=m.Message,
    ),
    Op(
        "get",
        "/api/rooms/{room_id}/messages",
        "listMessages",
        "Messages after `after_seq`.",
        "user",
        answer=m.Message,
        many=True,
        query=(("after_seq", _SEQ), ("limit", {"type": "integer", "minimum": 1, "maximum": 1000})),
    ),
    Op(
        "get",
        "/api/turns",
        "listTurns",
        "Turns without events, newest first.",
        "user",
        answer=m.Turn,
        many=True,
        query=(("agent_id", _UUID), ("limit", {"type": "integer", "minimum": 1, "maximum": 1000})),
    ),
    Op(
        "get",
        "/api/turns/{turn_id}",
        "getTurn",
        "A turn with its events.",
        "user",
        answer=m.TurnWithEvents,
    ),
    Op(
        "get",
        "/api/tasks",
        "listTasks",
        "Tasks (of a room when given).",
        "user",
        answer=m.Task,
        many=True,
        query=(("room_id", _UUID),),
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
    ),
    Op(
        "post",
        "/api/tasks/{number}/status",
        "taskStatus",
        "Move a task as the user.",
        "user",
        m.TaskStatusSet,
        answer=m.Task,
    ),
    Op(
        "post",
        "/api/tasks/{number}/assign",
        "assignTask",
        "Assign a task as the user.",
        "user",
        m.TaskAssign,
        answer=m.Task,
    ),
    Op(
        "post",
        "/api/dev/clock",
        "devClock",
        "--dev only: move the server clock forward and fire due reminders.",
        "user",
        m.DevClock,
        answer=m.ClockAnswer,
    ),
]

_PATH_PARAMS: dict[str, dict[str, Any]] = {
    "agent_id": _UUID,
    "turn_id": _UUID,
    "room_id": _UUID,
    "reminder_id": _UUID,
    "number": {"type": "integer", "minimum": 1},
}
_SECURITY = {"user": "userToken", "computer": "computerToken", "agent": "agentToken"}


def build() -> dict[str, Any]:
    """The OpenAPI document as a dict."""
    wanted: list[tuple[type[BaseModel], Any]] = []
    for op in OPS:
        if op.body is not None:
            wanted.append((op.body, "validation"))
        if op.answer is not None:
            wanted.append((op.answer, "serialization"))
    wanted += [(m.ErrorAnswer, "serialization"), (m.HeldAnswer, "serialization")]
    refs, defs = models_json_schema(
        list(dict.fromkeys(wanted)), ref_template="#/components/schemas/{model}"
    )
    schemas = defs.get("$defs", {})

    def ref(model: type[BaseModel], mode: str) -> dict[str, Any]:
        return dict(refs[(model, mode)])  # type: ignore[index]

    error = {"application/json": {"schema": ref(m.ErrorAnswer, "serialization")}}
    paths: dict[str, dict[str, Any]] = {}
    for op in OPS:
        item: dict[str, Any] = {"operationId": op.op_id, "summary": op.summary}
        params = [
            {"name": name, "in": "path", "required": True, "schema": _PATH_PARAMS[name]}
            for name in _path_names(op.path)
        ]
        params += [{"name": n, "in": "query", "required": False, "schema": s} for n, s in op.query]
        if params:
            item["parameters"] = params
        if op.auth != "none":
            item["security"] = [{_SECURITY[op.auth]: []}]
        if op.body is not None:
            # a body whose fields are all optional may be left out
            needed = any(f.is_required() for f in op.body.model_fields.values())
            item["requestBody"] = {
                "required": needed,
                "content": {"application/json": {"schema": ref(op.body, "validation")}},
            }
        responses: dict[str, Any] = {}
        if op.op_id == "computerEvents":
            responses["200"] = {
                "description": "An endless event stream.",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            }
        elif op.status == 204:
            responses["204"] = {"description": "Done."}
        else:
            assert op.answer is not None, op.op_id
            schema = ref(op.answer, "serialization")
            if op.many:
                schema = {"type": "array", "items": schema}
            responses[str(op.status)] = {
                "description": "Done.",
                "content": {"application/json": {"schema": schema}},
            }
        for status, model in op.extra.items():
            responses[status] = {
                "description": "Done (it existed).",
                "content": {"application/json": {"schema": ref(model, "serialization")}},
            }
        if op.auth != "none":
            for status in _ERRORS:
                responses[status] = {"$ref": f"#/components/responses/Error{status}"}
        if op.op_id == "reply":
            responses["409"] = {
                "description": "Held (`held: true` with the unseen messages), or refused.",
                "content": {
                    "application/json": {
                        "schema": {
                            "anyOf": [
                                ref(m.HeldAnswer, "serialization"),
                                ref(m.ErrorAnswer, "serialization"),
                            ]
                        }
                    }
                },
            }
        paths.setdefault(op.path, {})[op.method] = item | {"responses": responses}
    bearer = {"type": "http", "scheme": "bearer"}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Crew server (upstream) API",
            "version": "0.1.0",
            "description": (
                "The contract between the Computer, `crew` and the crew server "
                "(spec: upstream.md). Generated by `python -m crew_server.openapi`; do not edit "
                'by hand. Errors are `{"error": {"code", "message"}}`; refusals a user '
                "should read carry `code: refused` (409)."
            ),
        },
        "servers": [{"url": "http://127.0.0.1:8765"}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": {
                f"Error{status}": {"description": text, "content": error}
                for status, text in _ERRORS.items()
            },
            "securitySchemes": {
                "userToken": bearer
                | {"description": "printed once at first start; off with --dev"},
                "computerToken": bearer | {"description": "from POST /api/computers"},
                "agentToken": bearer | {"description": "from POST /computer/agents/{id}/token"},
            },
        },
    }


def _path_names(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


def render() -> str:
    """The document as YAML text (stable key order)."""
    import yaml  # a test/dev dependency: only generating the document needs it

    return str(yaml.safe_dump(build(), sort_keys=False, allow_unicode=True, width=100))


if __name__ == "__main__":
    sys.stdout.write(render())
