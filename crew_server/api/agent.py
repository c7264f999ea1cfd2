"""What agents call through `crew` (`/agent/...`, agent token): replies, tasks,
reminders and mutes."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from crew_server import models as m
from crew_server import rules
from crew_server.api.http import (
    Context,
    agent_actor,
    json_response,
    no_content,
    read_body,
    task_number,
    uuid_param,
)
from crew_server.api.operation import UUID, Op
from crew_server.errors import Refused


async def reply(ctx: Context, request: Request) -> Response:
    """Post a reply (409 `held` when the agent has not seen newer messages)."""
    received_at = ctx.store.clock.now()  # the turn's trace: the reply reached the server
    identity = ctx.agent(request)
    body = await read_body(request, m.Reply)
    answer = ctx.store.reply(identity, body.room_id, body.body, body.thread_of, received_at)
    return json_response(answer, 201)


async def list_tasks(ctx: Context, request: Request) -> Response:
    """Tasks of a room."""
    identity = ctx.agent(request)
    return json_response(
        ctx.store.list_tasks(agent_actor(identity), uuid_param(request, "room_id"))
    )


async def create_task(ctx: Context, request: Request) -> Response:
    """A task hosted on a new message."""
    identity = ctx.agent(request)
    body = await read_body(request, m.TaskCreate)
    task = ctx.store.create_task(agent_actor(identity), body.room_id, body.title, body.assignee)
    return json_response(task, 201)


async def convert_task(ctx: Context, request: Request) -> Response:
    """Make a message a task."""
    identity = ctx.agent(request)
    body = await read_body(request, m.TaskConvert)
    task = ctx.store.convert_task(agent_actor(identity), body.message_id, body.assignee)
    return json_response(task, 201)


async def claim_task(ctx: Context, request: Request) -> Response:
    """Take the task."""
    identity = ctx.agent(request)
    body = await read_body(request, m.TaskClaim)
    return json_response(
        ctx.store.claim_task(agent_actor(identity), task_number(request), body.room_id)
    )


async def task_status(ctx: Context, request: Request) -> Response:
    """Move the task."""
    identity = ctx.agent(request)
    body = await read_body(request, m.TaskStatusSet)
    return json_response(
        ctx.store.set_task_status(
            agent_actor(identity), task_number(request), body.status, body.note, body.room_id
        )
    )


async def assign_task(ctx: Context, request: Request) -> Response:
    """Hand the task over."""
    identity = ctx.agent(request)
    body = await read_body(request, m.TaskAssign)
    return json_response(
        ctx.store.assign_task(
            agent_actor(identity), task_number(request), body.assignee, body.room_id
        )
    )


async def create_reminder(ctx: Context, request: Request) -> Response:
    """A reminder to itself; the scheduler looks again."""
    identity = ctx.agent(request)
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
    reminder = ctx.store.create_reminder(identity, body.room_id, body.title, schedule)
    ctx.scheduler.poke()
    return json_response(reminder, 201)


async def list_reminders(ctx: Context, request: Request) -> Response:
    """The caller's reminders."""
    return json_response(ctx.store.list_reminders(ctx.agent(request).agent_id))


async def delete_reminder(ctx: Context, request: Request) -> Response:
    """Cancel a reminder."""
    ctx.store.delete_reminder(ctx.agent(request).agent_id, request.path_params["reminder_id"])
    ctx.scheduler.poke()
    return no_content()


async def mute(ctx: Context, request: Request) -> Response:
    """Mute a group."""
    identity = ctx.agent(request)
    body = await read_body(request, m.MuteSet)
    return json_response(ctx.store.mute(identity, request.path_params["room_id"], body.until))


async def unmute(ctx: Context, request: Request) -> Response:
    """Unmute (wakes nobody)."""
    identity = ctx.agent(request)
    ctx.store.unmute(identity.agent_id, request.path_params["room_id"])
    return no_content()


# This caller's rows of the route table (`routes.OPS` joins them): the app serves them,
# `crew_server.openapi` documents them.
OPS: list[Op] = [
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
        handler=reply,
        idempotent=True,
    ),
    Op(
        "get",
        "/agent/tasks",
        "agentTasks",
        "Tasks of a room (a thread stands for its group).",
        "agent",
        answer=m.Task,
        many=True,
        query=(("room_id", UUID),),
        handler=list_tasks,
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
        handler=create_task,
        idempotent=True,
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
        handler=convert_task,
        idempotent=True,
    ),
    Op(
        "post",
        "/agent/tasks/{number}/claim",
        "agentClaimTask",
        "Take the task (refused when someone else holds it).",
        "agent",
        answer=m.Task,
        handler=claim_task,
        idempotent=True,
    ),
    Op(
        "post",
        "/agent/tasks/{number}/status",
        "agentTaskStatus",
        "Move the task (assignee only); the note goes into the notice.",
        "agent",
        m.TaskStatusSet,
        answer=m.Task,
        handler=task_status,
        idempotent=True,
    ),
    Op(
        "post",
        "/agent/tasks/{number}/assign",
        "agentAssignTask",
        "Hand the task over (when unassigned or held by the caller).",
        "agent",
        m.TaskAssign,
        answer=m.Task,
        handler=assign_task,
        idempotent=True,
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
        handler=create_reminder,
        idempotent=True,
    ),
    Op(
        "get",
        "/agent/reminders",
        "listReminders",
        "The caller's reminders.",
        "agent",
        answer=m.Reminder,
        many=True,
        handler=list_reminders,
    ),
    Op(
        "delete",
        "/agent/reminders/{reminder_id}",
        "deleteReminder",
        "Cancel a reminder.",
        "agent",
        status=204,
        handler=delete_reminder,
        idempotent=True,
    ),
    Op(
        "put",
        "/agent/mutes/{room_id}",
        "mute",
        "Mute a group (15 minutes to 7 days, or until unmuted); @mentions still wake.",
        "agent",
        m.MuteSet,
        answer=m.MuteAnswer,
        handler=mute,
        idempotent=True,
    ),
    Op(
        "delete",
        "/agent/mutes/{room_id}",
        "unmute",
        "Unmute (wakes nobody).",
        "agent",
        status=204,
        handler=unmute,
        idempotent=True,
    ),
]
