"""The web app: a person works with their agents in a browser, served by `crew-server`
at `/` (same port, same process as the API).

Pages are rendered on the server (Jinja2, `templates/`), live parts are updated over
one SSE stream per browser (`live.py`, shared by its tabs through a SharedWorker), and
the scripts (`static/`, our own, no library) only subscribe to it, send the composer
without a reload and complete `@handles`. Sign-in exchanges the user token (or a
sign-in link's one-time code) for an HttpOnly session cookie (`session.py`); every
form post carries a CSRF token (`access.py`). `crew_server.app` adds `web_routes(ctx)`.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from crew_server.api.http import Context
from crew_server.web import actions, live, views
from crew_server.web.access import FormAction, PageView, Web, form_action, page_view
from crew_server.web.render import HERE

__all__ = ["web_routes"]


def web_routes(ctx: Context) -> list[BaseRoute]:
    """The web app's routes (none under /api, /computer, /agent: those are the API's)."""
    web = Web(ctx)
    # The live streams look again when the store changed, and end when the server stops.
    ctx.store.changed_listener = web.live.changed
    ctx.hub.on_close.append(web.live.stopping)

    def get(path: str, view: PageView) -> Route:
        return Route(path, page_view(web, view), methods=["GET"])

    def post(path: str, action: FormAction, fallback: str = "/rooms") -> Route:
        return Route(path, form_action(web, action, fallback), methods=["POST"])

    async def sign_in_form(request: Request) -> Response:
        return await actions.sign_in_form(web, request)

    async def sign_in(request: Request) -> Response:
        return await actions.sign_in(web, request)

    return [
        Route("/login", sign_in_form, methods=["GET"]),
        Route("/login", sign_in, methods=["POST"]),
        post("/logout", actions.sign_out),
        get("/", views.home),
        get("/rooms", views.rooms),
        post("/rooms", actions.create_room),
        get("/rooms/{room_id}", views.room),
        post("/rooms/{room_id}/messages", actions.post_message),
        post("/rooms/{room_id}/mutes", actions.mute),
        post("/rooms/{room_id}/loop-guard", actions.loop_guard),
        post("/rooms/{room_id}/status/dismiss", actions.dismiss_status),
        post("/rooms/{room_id}/title", actions.rename_room),
        post("/rooms/{room_id}/members", actions.set_members),
        get("/rooms/{room_id}/delete", views.confirm_room_delete),
        post("/rooms/{room_id}/delete", actions.delete_room),
        get("/agents", views.agents),
        post("/agents", actions.create_agent, "/agents"),
        get("/agents/{agent_id}", views.agent),
        post("/agents/{agent_id}", actions.edit_agent, "/agents"),
        post("/agents/{agent_id}/budget/resume", actions.resume_budget, "/agents"),
        post("/agents/{agent_id}/capabilities", actions.set_capabilities, "/agents"),
        get("/agents/{agent_id}/delete", views.confirm_agent_delete),
        post("/agents/{agent_id}/delete", actions.delete_agent, "/agents"),
        post("/agents/{agent_id}/stop", actions.stop_turn, "/agents"),
        post("/agents/{agent_id}/wake", actions.wake_agent, "/agents"),
        get("/turns/{turn_id}", views.turn),
        get("/tasks", views.tasks),
        post("/tasks", actions.create_task, "/tasks"),
        post("/tasks/convert", actions.convert_task, "/tasks"),
        post("/approvals/{approval_id}", actions.answer_approval),
        post("/tasks/{number}/status", actions.task_status, "/tasks"),
        post("/tasks/{number}/assign", actions.assign_task, "/tasks"),
        get("/computers", views.computers),
        post("/computers", actions.create_computer, "/computers"),
        get("/computers/{computer_id}/delete", views.confirm_computer_delete),
        post("/computers/{computer_id}/delete", actions.delete_computer, "/computers"),
        get("/live", live.browser),
        post("/live/subscriptions", live.subscribe),
        post("/live/subscriptions/leave", live.leave),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
