"""The launcher's HTTP API (launcher.md; `openapi/launcher.yaml`).

Routes fit on one screen; every request needs the bearer secret. `POST /runs`
answers with an NDJSON stream whose life is the run's life: the response
owns the engine run, and a client that goes away stops it.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any, TypeVar

import anyio
import orjson
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from crew_common.launcher_wire import (
    Denials,
    DeniedFrame,
    ModelList,
    ModelsRequest,
    RunList,
    RunRequest,
    ServerLimitHit,
    ServerList,
    ServerRequest,
    ServerStopped,
    StopResult,
    SweepResult,
)
from sandbox_launcher.engine_run import EngineRun
from sandbox_launcher.launcher import Launcher, RequestRefused
from sandbox_launcher.models import ModelsFailed, list_models
from sandbox_launcher.warm_server import WarmServer, rss_bytes

log = logging.getLogger(__name__)

MAX_BODY = 40 * 1024 * 1024
RequestT = TypeVar("RequestT", bound=BaseModel)


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        if isinstance(content, BaseModel):
            return content.model_dump_json().encode("utf-8")
        return orjson.dumps(content)


def error(status: int, code: str, message: str) -> JSONResponse:
    """The error shape of every launcher answer: `{"error": {"code", "message"}}`."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


class BearerAuth:
    """Refuses (401) every request without `Authorization: Bearer <secret>`."""

    def __init__(self, app: ASGIApp, secret: str) -> None:
        self.app = app
        self._expected = f"Bearer {secret}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                response = error(
                    401, "unauthorized", "missing or wrong bearer secret for this launcher"
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class RunStream(Response):
    """Streams one run's frames; stops the run when the client disconnects."""

    media_type = "application/x-ndjson"

    def __init__(self, launcher: Launcher, run: EngineRun) -> None:
        super().__init__(status_code=200)
        # Streamed (chunked): no content-length, unlike a plain Response.
        self.raw_headers = [(b"content-type", self.media_type.encode())]
        self.launcher = launcher
        self.run = run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        run = self.run
        self.launcher.add_run(run)

        async def emit(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        async def watch_disconnect() -> None:
            while True:
                message: Message = await receive()
                if message["type"] == "http.disconnect":
                    log.info("client of run %s disconnected; stopping it", run.run_id)
                    run.client_gone = True
                    run.request_stop()
                    return

        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_disconnect)
                try:
                    exit_frame = await run.execute(emit)
                except OSError as exc:
                    log.error("run %s could not start: %s", run.run_id, exc)
                    exit_frame = None
                    await emit(
                        orjson.dumps(
                            {
                                "t": "exit",
                                "code": None,
                                "signal": None,
                                "stderr_tail": f"the sandbox could not be started: {exc}",
                                "reason": None,
                            }
                        )
                        + b"\n"
                    )
                tg.cancel_scope.cancel()
            # Before the exit frame: once a turn is seen to end, nothing it planted in
            # git hooks or config is left (`git_guard`).
            await anyio.to_thread.run_sync(self.launcher.run_ended, run.run_id)
            if exit_frame is not None and not run.client_gone:
                await emit(exit_frame.model_dump_json().encode("utf-8") + b"\n")
            if not run.client_gone:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError as exc:
            log.info("client of run %s went away while finishing: %s", run.run_id, exc)
        finally:
            self.launcher.run_ended(run.run_id)
            if run.network is not None:
                run.network.close()  # idempotent; covers a run that never got to start


def create_app(launcher: Launcher, secret: str) -> ASGIApp:
    """The ASGI app: Starlette routes behind the bearer check."""

    async def health(request: Request) -> Response:
        return JSONResponse(launcher.health())

    async def start_run(request: Request) -> Response:
        run_request = await _body(request, RunRequest, "run request")
        return RunStream(launcher, launcher.prepare(run_request))

    async def stop_run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        run = launcher.runs.get(run_id)
        if run is None:
            return error(404, "unknown_run", f"no run {run_id} is running")
        run.request_stop()
        return JSONResponse(StopResult(run_id=run_id, stopping=True))

    async def list_runs(request: Request) -> Response:
        return JSONResponse(RunList(runs=[r.info() for r in launcher.runs.values()]))

    async def runs(request: Request) -> Response:
        return await (start_run if request.method == "POST" else list_runs)(request)

    async def models(request: Request) -> Response:
        models_request = await _body(request, ModelsRequest, "models request")
        if launcher.config.opencode is None:
            return error(503, "engine_missing", "opencode was not found when the launcher started")
        # A stop ends a listing at once (`listings`): it must not hold the shutdown up.
        with anyio.CancelScope() as listing:
            launcher.listings.add(listing)
            try:
                found = await list_models(str(launcher.config.opencode), models_request)
            except ModelsFailed as exc:
                return error(exc.status, exc.code, str(exc))
            finally:
                launcher.listings.discard(listing)
        if listing.cancelled_caught:
            return error(503, "stopping", "the launcher is stopping; ask the next one")
        return JSONResponse(ModelList(models=found))

    # ---- warm servers (sandbox_launcher/warm_server.py) ----

    async def servers(request: Request) -> Response:
        if request.method == "GET":
            listing = await anyio.to_thread.run_sync(launcher.servers.listing)
            return JSONResponse(ServerList(servers=listing))
        server_request = await _body(request, ServerRequest, "server request")
        return JSONResponse(await launcher.start_server(server_request))

    async def sweep_server(request: Request) -> Response:
        agent_id = request.path_params["agent_id"]
        server = _known(launcher.servers.get(agent_id), agent_id)
        killed = await anyio.to_thread.run_sync(server.sweep)
        await anyio.to_thread.run_sync(launcher.server_turn_ended, agent_id, False)
        rss = rss_bytes(server.pid) if server.pid is not None else None
        return JSONResponse(SweepResult(agent_id=agent_id, killed=killed, rss_bytes=rss))

    async def server_limit(request: Request) -> Response:
        agent_id = request.path_params["agent_id"]
        server = _known(launcher.servers.peek(agent_id), agent_id)
        hit = await anyio.to_thread.run_sync(server.check_limits)
        return JSONResponse(ServerLimitHit(agent_id=agent_id, limit_hit=hit))

    async def server_denials(request: Request) -> Response:
        agent_id = request.path_params["agent_id"]
        server = _known(launcher.servers.peek(agent_id), agent_id)
        found = await anyio.to_thread.run_sync(server.denials)
        frames = [DeniedFrame(t="denied", **d.as_json()) for d in found]  # type: ignore[arg-type]
        return JSONResponse(Denials(agent_id=agent_id, denials=frames))

    async def stop_server(request: Request) -> Response:
        agent_id = request.path_params["agent_id"]
        server = _known(launcher.servers.remove(agent_id), agent_id)
        code = await anyio.to_thread.run_sync(server.stop)
        await anyio.to_thread.run_sync(launcher.server_turn_ended, agent_id, True)
        return JSONResponse(ServerStopped(agent_id=agent_id, exit_code=code))

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/servers", servers, methods=["GET", "POST"]),
        Route("/servers/{agent_id}/sweep", sweep_server, methods=["POST"]),
        Route("/servers/{agent_id}/stop", stop_server, methods=["POST"]),
        Route("/servers/{agent_id}/limit", server_limit, methods=["GET"]),
        Route("/servers/{agent_id}/denials", server_denials, methods=["POST"]),
        Route("/runs", runs, methods=["GET", "POST"]),
        Route("/runs/{run_id}/stop", stop_run, methods=["POST"]),
        Route("/models", models, methods=["POST"]),
    ]
    handlers = {404: _not_found, 405: _not_allowed, RequestRefused: _refused}
    app = Starlette(routes=routes, exception_handlers=handlers)
    return BearerAuth(app, secret)


def _known(server: WarmServer | None, agent_id: str) -> WarmServer:
    """The agent's server as the registry found it; `RequestRefused` (404) for none."""
    if server is None:
        raise RequestRefused(404, "unknown_server", f"agent {agent_id} has no warm server")
    return server


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestRefused)
    return error(exc.status, exc.code, exc.message)


async def _not_found(request: Request, exc: Exception) -> Response:
    return error(404, "not_found", f"no such endpoint: {request.url.path}")


async def _not_allowed(request: Request, exc: Exception) -> Response:
    answer = error(
        405, "method_not_allowed", f"{request.method} is not allowed on {request.url.path}"
    )
    allow = (getattr(exc, "headers", None) or {}).get("Allow")
    if allow:  # RFC 9110: a 405 lists the methods that are allowed
        answer.headers["Allow"] = allow
    return answer


async def _body(request: Request, model: type[RequestT], what: str) -> RequestT:
    """The request body read as `model` (`what` names it); raises `RequestRefused` (413, 400).

    The body is capped as it arrives: reading stops once it grows over `MAX_BODY`.
    """
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise RequestRefused(413, "too_large", f"the request body is over {MAX_BODY} bytes")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise RequestRefused(400, "invalid_request", _validation_message(exc, what)) from exc


def _validation_message(exc: ValidationError, what: str) -> str:
    # Never echo the input: env values carry credentials.
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    return f"invalid {what}: " + "; ".join(parts)
