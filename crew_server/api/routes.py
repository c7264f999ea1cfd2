"""The route table, `OPS`: every operation of the upstream API, who calls it, what it
takes and answers, and the handler that serves it.

It exists once: `crew_server.app` routes requests by it and `crew_server.openapi`
writes `openapi/upstream.yaml` from it. The rows live next to their handlers, one
list per caller.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from crew_server import models as m
from crew_server.api import agent, approvals, computer, user
from crew_server.api.http import Context, json_response
from crew_server.api.idempotency import idempotent
from crew_server.api.operation import Op
from crew_server.errors import Invalid


async def health(ctx: Context, request: Request) -> Response:
    """The server answers."""
    return json_response({"ok": True})


OPS: list[Op] = [
    Op("get", "/health", "health", "The server answers.", "none", answer=m.Health, handler=health),
    *computer.OPS,  # the Computer
    *approvals.COMPUTER_OPS,  # the Computer asks the person (issue 24)
    *agent.OPS,  # agents, through `crew`
    *user.OPS,  # the user (demo, UI, tests)
    *approvals.USER_OPS,  # the user answers (issue 24)
]


def starlette_routes(ctx: Context) -> list[Route]:
    """The app's routes: one per path, in table order, each serving that path's methods."""
    by_path: dict[str, list[Op]] = {}
    for op in OPS:
        by_path.setdefault(op.path, []).append(op)
    return [_route(ctx, path, ops) for path, ops in by_path.items()]


def _route(ctx: Context, path: str, ops: list[Op]) -> Route:
    """One route per path dispatching on the method, so a 405 lists every allowed method.

    Query parameters that none of the path's operations take are refused: a typo must
    not pass silently.
    """
    handlers = {
        op.method.upper(): idempotent(op.handler) if op.idempotent else op.handler for op in ops
    }
    query = tuple(dict.fromkeys(name for op in ops for name, _ in op.query))

    async def endpoint(request: Request) -> Response:
        unknown = sorted(set(request.query_params) - set(query))
        if unknown:
            allowed = ", ".join(query) or "none"
            raise Invalid(f"unknown query parameter {unknown[0]!r}; this endpoint takes: {allowed}")
        method = "GET" if request.method == "HEAD" else request.method
        return await handlers[method](ctx, request)

    return Route(path, endpoint, methods=list(handlers))
