"""An unsandboxed stand-in of the launcher's API, for client and engine tests.

It speaks the same HTTP as `sandbox_launcher` (launcher.md, docs/contracts.md):
bearer secret, `/health`, `/runs` streaming NDJSON frames, `/runs/{id}/stop`,
`/runs`, `/models`. Runs really execute `opencode_path` (a fake engine script)
in a new process group with exactly the given env — but with NO sandbox.
Served by uvicorn on a Unix socket, in-process (`serve_standin`) or as a
child process (`python tests/computer_unit/launcher_standin.py …`, which
reads the secret from stdin and prints `ready` like the real launcher).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import orjson
import uvicorn
from anyio.abc import Process
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from crew_harness.waiting import wait_until_async

STDERR_TAIL = 64 * 1024


@dataclass
class StandinState:
    secret: str
    opencode_path: str
    health: dict[str, Any] = field(
        default_factory=lambda: {
            "sandbox": {"ok": True, "backend": "bwrap", "reason": None},
            "engine": {"path": "fake", "version": "0.0.0"},
        }
    )
    models: list[str] = field(default_factory=lambda: ["local/scripted", "local/other"])
    running: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    models_requests: list[Any] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def make_app(state: StandinState) -> Starlette:
    def authorized(request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {state.secret}"

    async def health(request: Request) -> Response:
        if not authorized(request):
            return _error(401, "unauthorized", "bad secret")
        return JSONResponse(state.health)

    async def models(request: Request) -> Response:
        if not authorized(request):
            return _error(401, "unauthorized", "bad secret")
        state.models_requests.append(await request.json())
        return JSONResponse({"models": state.models})

    async def list_runs(request: Request) -> Response:
        if not authorized(request):
            return _error(401, "unauthorized", "bad secret")
        return JSONResponse(
            {
                "runs": [
                    {k: v for k, v in r.items() if k != "process"} for r in state.running.values()
                ]
            }
        )

    async def stop(request: Request) -> Response:
        if not authorized(request):
            return _error(401, "unauthorized", "bad secret")
        run_id = request.path_params["run_id"]
        state.stops.append(run_id)
        run = state.running.get(run_id)
        if run is None:
            return _error(404, "not_found", f"no run {run_id}")
        run["stopped"] = True
        _signal_group(run["pid"], signal.SIGINT)
        return Response(status_code=204)

    async def start_run(request: Request) -> Response:
        if not authorized(request):
            return _error(401, "unauthorized", "bad secret")
        body = orjson.loads(await request.body())
        state.requests.append(body)
        if not state.health["sandbox"]["ok"]:
            return _error(503, "sandbox_unavailable", state.health["sandbox"]["reason"])
        bad = [k for k in body["env"] if not _allowed_env(k)]
        if bad:
            return _error(400, "bad_request", f"env keys not allowed: {bad}")
        args = body["engine_args"]
        argv = [state.opencode_path, "run", "--pure", "--format", "json", "--print-logs", "--auto"]
        argv += ["--title", args["title"], "--dir", args["dir"]]
        if args.get("session_id"):
            argv += ["--session", args["session_id"]]
        argv += ["--model", args["model"]]
        proc = await anyio.open_process(
            argv,
            stdin=-1,
            stdout=-1,
            stderr=-1,
            env=body["env"],
            cwd=args["dir"],
            start_new_session=True,
        )
        run = {
            "id": body["run_id"],
            "agent_id": body["agent_id"],
            "pid": proc.pid,
            "started": time.time(),
            "bytes_out": 0,
            "stopped": False,
        }
        state.running[body["run_id"]] = run
        return StreamingResponse(
            _frames(state, run, proc, body["stdin"].encode(), body["stdout_limit"]),
            media_type="application/x-ndjson",
        )

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/models", models, methods=["POST"]),
            Route("/runs", list_runs, methods=["GET"]),
            Route("/runs", start_run, methods=["POST"]),
            Route("/runs/{run_id}/stop", stop, methods=["POST"]),
        ]
    )


ALLOWED_ENV = {
    "PATH", "LANG", "TMPDIR", "TMPPREFIX", "HOME", "PWD", "XDG_DATA_HOME", "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME", "XDG_STATE_HOME", "OPENCODE_DISABLE_PROJECT_CONFIG", "OPENCODE_AUTH_CONTENT",
    "OPENCODE_CONFIG_CONTENT", "OPENCODE_DISABLE_MODELS_FETCH", "CREW_SERVER_URL", "CREW_TOKEN_FILE",
    "CREW_TURN_FILE",
}  # fmt: skip


def _allowed_env(key: str) -> bool:
    return key in ALLOWED_ENV or key.startswith("FAKE_OPENCODE_")


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _frames(
    state: StandinState, run: dict[str, Any], proc: Process, stdin: bytes, limit: int
) -> AsyncIterator[bytes]:
    assert proc.stdin and proc.stdout and proc.stderr
    stderr = bytearray()
    reason: str | None = None
    try:
        yield orjson.dumps({"t": "started", "pid": proc.pid}) + b"\n"
        with contextlib.suppress(anyio.BrokenResourceError):
            await proc.stdin.send(stdin)
        await proc.stdin.aclose()

        async def drain_stderr() -> None:
            async for chunk in proc.stderr:  # type: ignore[union-attr]
                stderr.extend(chunk)
                del stderr[:-STDERR_TAIL]

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain_stderr)
            buf = bytearray()
            total = 0
            async for chunk in proc.stdout:
                total += len(chunk)
                run["bytes_out"] = total
                if total > limit:
                    reason = "output_too_large"
                    _signal_group(proc.pid, signal.SIGKILL)
                    break
                buf += chunk
                while (nl := buf.find(b"\n")) >= 0:
                    line = bytes(buf[:nl])
                    del buf[: nl + 1]
                    data = line.decode("utf-8", "replace")
                    yield orjson.dumps({"t": "line", "data": data}) + b"\n"
            if buf and reason is None:
                yield orjson.dumps({"t": "line", "data": buf.decode("utf-8", "replace")}) + b"\n"
            code = await proc.wait()
            _signal_group(proc.pid, signal.SIGKILL)
            tg.cancel_scope.cancel()
        if run["stopped"] and reason is None:
            reason = "stopped"
        exit_code = code if code >= 0 else None
        sig = -code if code < 0 else None
        yield (
            orjson.dumps(
                {
                    "t": "exit",
                    "code": exit_code,
                    "signal": sig,
                    "stderr_tail": stderr.decode("utf-8", "replace"),
                    "reason": reason,
                }
            )
            + b"\n"
        )
    finally:
        state.running.pop(run["id"], None)
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGKILL)
            with anyio.CancelScope(shield=True):
                await proc.wait()


@contextlib.asynccontextmanager
async def serve_standin(socket_path: Path, state: StandinState) -> AsyncIterator[StandinState]:
    """Serve the stand-in on `socket_path` for the duration of the block."""
    config = uvicorn.Config(
        make_app(state), uds=str(socket_path), log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        await wait_until_async("the stand-in to serve", lambda: server.started)
        try:
            yield state
        finally:
            server.should_exit = True


def main() -> None:
    """Child-process mode: `launcher_standin.py SOCKET OPENCODE_PATH` (secret on stdin)."""
    socket_path, opencode_path = Path(sys.argv[1]), sys.argv[2]
    secret = sys.stdin.readline().strip()
    state = StandinState(secret=secret, opencode_path=opencode_path)

    async def run() -> None:
        async with serve_standin(socket_path, state):
            print("ready", flush=True)
            # Exit when our stdin closes, like the real launcher.
            await anyio.to_thread.run_sync(sys.stdin.read)

    anyio.run(run)


if __name__ == "__main__":
    main()
