"""The reference crew server's HTTP API (Starlette): computer, agent and user endpoints.

`create_app(store, clock, dev)` wires it: the event hub the store notifies, the
reminder scheduler the lifespan runs, and the routes of the table in
`crew_server.api.routes`. Tests drive it in-process through `httpx.ASGITransport`,
`crew-server` serves it with uvicorn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware

from crew_server.api.hosts import HostAllowList
from crew_server.api.http import Context, api_error, http_error, server_error
from crew_server.api.routes import starlette_routes
from crew_server.api.stream import PING_SECONDS, EventHub
from crew_server.clock import Clock
from crew_server.errors import ApiError
from crew_server.scheduler import ReminderScheduler
from crew_server.store import Store
from crew_server.web import web_routes

__all__ = ["PING_SECONDS", "EventHub", "create_app"]


def create_app(
    store: Store,
    clock: Clock,
    dev: bool = False,
    *,
    ping_seconds: float = PING_SECONDS,
    run_scheduler: bool = True,
    public_url: str | None = None,
    allowed_hosts: frozenset[str] | None = None,
) -> Starlette:
    """The ASGI app. `dev` enables `POST /api/dev/clock` (which wants the user token too).

    `public_url` is the URL Computers and browsers reach the server at (the
    Computers page puts it in the bootstrap line); `allowed_hosts` the names a
    request's `Host` may carry (crew_server/api/hosts.py). crew-server passes
    both; in-process tests may leave them out (any Host, the request's URL).
    """
    hub = EventHub()
    store.listener = hub.notify
    scheduler = ReminderScheduler(store, clock)
    ctx = Context(store, clock, hub, scheduler, dev, ping_seconds, public_url=public_url)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tasks:
            # Several processes on one PostgreSQL database: their commits wake our streams.
            tasks.start_soon(store.follow_other_processes, hub.notify, hub.notify_all)
            if run_scheduler:
                tasks.start_soon(scheduler.run)
            yield
            tasks.cancel_scope.cancel()

    app = Starlette(
        # The API's routes, then the web app's pages at / (crew_server/web).
        routes=[*starlette_routes(ctx), *web_routes(ctx)],
        exception_handlers={ApiError: api_error, HTTPException: http_error, 500: server_error},
        lifespan=lifespan,
        middleware=[]
        if allowed_hosts is None
        else [Middleware(HostAllowList, allowed=allowed_hosts)],
    )
    app.state.store = store
    app.state.scheduler = scheduler
    app.state.hub = hub
    return app
