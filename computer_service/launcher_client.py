"""Talking to the sandbox launcher: its process (`LauncherProcess`) and its API (`LauncherClient`).

The launcher is the only process that starts sandboxed engines (launcher.md).
The Computer starts it as a child (docs/contracts.md "Launcher process"),
hands it a bearer secret over stdin, waits for `ready`, and then speaks
HTTP+JSON to it over a private Unix socket. A run streams NDJSON frames:
`started`, one `line` per engine stdout line, and a final `exit`.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import signal
import subprocess
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx
import orjson
from anyio.abc import Process
from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger(__name__)

DEFAULT_STDOUT_LIMIT = 8 * 1024 * 1024
# A `line` frame carries one stdout line as a JSON string; escaping can grow it
# up to 6× (\u00XX), so frames get a generous cap of their own.
FRAME_LIMIT = 6 * DEFAULT_STDOUT_LIMIT + 4096
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0


class LauncherError(Exception):
    """The launcher could not do what was asked; the message says why."""


class LauncherUnavailable(LauncherError):
    """The launcher cannot be reached (not started, died, socket gone)."""


class LauncherNotListening(LauncherUnavailable):
    """Nobody listens on the launcher's socket (refused, gone): the request was never sent."""


class LauncherRefused(LauncherError):
    """The launcher refused a request (4xx/503) with a reason.

    `status` is the HTTP status; 503 means the sandbox is unusable.
    """

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


# ---- request and answer models (launcher.md, docs/contracts.md) ----


class EngineArgs(BaseModel):
    """Typed engine arguments; the launcher builds the argv from them, never a free argv."""

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = None
    model: str
    title: str
    dir: str


class RunRequest(BaseModel):
    """`POST /runs` body."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    agent_id: str
    agent_dir: str
    runtime_dir: str
    bin_dir: str
    interpreter_dirs: list[str] = Field(default_factory=list)
    model: str
    session_id: str | None = None
    env: dict[str, str]
    stdin: str
    stdout_limit: int = DEFAULT_STDOUT_LIMIT
    engine_args: EngineArgs
    loopback_ports: list[int] = Field(default_factory=list)


class ModelsRequest(BaseModel):
    """`POST /models` body: the OpenCode variables and the price table of `opencode models`."""

    model_config = ConfigDict(extra="forbid")

    env: dict[str, str]
    price_table: str | None = None


class ServerRequest(BaseModel):
    """`POST /servers` body: the agent's directories and environment, with the server's password."""

    model_config = ConfigDict(extra="forbid")

    agent_id: str
    agent_dir: str
    runtime_dir: str
    bin_dir: str
    interpreter_dirs: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(repr=False)
    loopback_ports: list[int] = Field(default_factory=list)


class ServerInfo(BaseModel):
    """A warm server as the launcher reports it (`POST /servers`, `GET /servers`)."""

    model_config = ConfigDict(extra="ignore")
    agent_id: str
    pid: int
    start_time: int
    port: int = Field(ge=1, le=65535)
    started_at: str = ""
    rss_bytes: int | None = None
    # Who holds the host side of `port` (the server, or the launcher's pasta): owner-checked.
    listener_pid: int
    listener_start_time: int


# The exit frame's reasons for a run (or a warm server) ended at a resource limit.
LIMIT_HITS = ("process_limit", "memory_limit", "shm_full", "disk_limit")


class StartedFrame(BaseModel):
    model_config = ConfigDict(extra="ignore")
    t: Literal["started"]
    pid: int | None = None


class LineFrame(BaseModel):
    model_config = ConfigDict(extra="ignore")
    t: Literal["line"]
    data: str


class LogFrame(BaseModel):
    """An OpenCode log line about a model request (`stream`, `stream error`)."""

    model_config = ConfigDict(extra="ignore")
    t: Literal["log"]
    line: str


class ExitFrame(BaseModel):
    model_config = ConfigDict(extra="ignore")
    t: Literal["exit"]
    code: int | None = None
    signal: int | None = None
    stderr_tail: str = ""
    reason: str | None = None


Frame = StartedFrame | LineFrame | LogFrame | ExitFrame


class SandboxHealth(BaseModel):
    model_config = ConfigDict(extra="ignore")
    ok: bool
    backend: str | None = None
    reason: str | None = None
    not_granted: list[str] = Field(default_factory=list)
    network: str | None = None


class EngineHealth(BaseModel):
    model_config = ConfigDict(extra="ignore")
    path: str | None = None
    version: str | None = None


class LauncherHealth(BaseModel):
    """`GET /health`: is the sandbox usable, and is `opencode` found."""

    model_config = ConfigDict(extra="ignore")
    sandbox: SandboxHealth
    engine: EngineHealth | None = None


def frame_of(line: bytes) -> Frame:
    """Parse one NDJSON frame; raises `LauncherError` for anything else."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise LauncherError(f"the launcher sent a frame that is not JSON: {exc}") from exc
    kind = obj.get("t") if isinstance(obj, dict) else None
    try:
        if kind == "line":
            return LineFrame.model_validate(obj)
        if kind == "started":
            return StartedFrame.model_validate(obj)
        if kind == "exit":
            return ExitFrame.model_validate(obj)
        if kind == "log":
            return LogFrame.model_validate(obj)
    except ValidationError as exc:
        raise LauncherError(f"the launcher sent a malformed {kind!r} frame: {exc}") from exc
    raise LauncherError(f"the launcher sent an unknown frame type {kind!r}")


async def split_lines(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """Yield newline-terminated lines from byte chunks, each at most `limit` bytes.

    No 64 KiB default: OpenCode lines reach ~100 KB. A last line without a
    newline is yielded too.
    """
    buf = bytearray()
    async for chunk in chunks:
        buf += chunk
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            yield bytes(buf[start:nl])
            start = nl + 1
        del buf[:start]
        if len(buf) > limit:
            raise LauncherError(f"the launcher sent a frame over {limit} bytes")
    if buf:
        yield bytes(buf)


class LauncherClient:
    """HTTP client of the launcher's Unix socket, with the bearer secret."""

    def __init__(self, socket_path: Path | str, secret: str) -> None:
        self.socket_path = str(socket_path)
        self._client = httpx.AsyncClient(
            # A Unix socket: no TLS, so no CA bundle to load (~30 ms).
            transport=httpx.AsyncHTTPTransport(uds=self.socket_path, verify=False),
            base_url="http://launcher",
            headers={"Authorization": f"Bearer {secret}"},
            timeout=httpx.Timeout(10.0),
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    async def __aenter__(self) -> LauncherClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def health(self) -> LauncherHealth:
        """`GET /health`."""
        answer = await self._request("GET", "/health")
        return _validate(LauncherHealth, answer)

    async def runs(self) -> list[dict[str, Any]]:
        """`GET /runs`: what is running now."""
        answer = await self._request("GET", "/runs")
        runs = answer.get("runs", answer) if isinstance(answer, dict) else answer
        if not isinstance(runs, list):
            raise LauncherError("the launcher's /runs answer is not a list")
        return runs

    async def models(self, request: ModelsRequest, timeout_s: float = 40.0) -> list[str]:
        """`POST /models`: the `provider/model` lines of `opencode models`."""
        body = orjson.dumps(request.model_dump(mode="json"))
        answer = await self._request("POST", "/models", timeout=timeout_s, content=body)
        models = answer.get("models") if isinstance(answer, dict) else answer
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise LauncherError("the launcher's /models answer is not a list of names")
        return list(models)

    async def start_server(self, request: ServerRequest, timeout_s: float = 90.0) -> ServerInfo:
        """`POST /servers`: start the agent's warm server; answers once it listens."""
        body = orjson.dumps(request.model_dump(mode="json"))
        answer = await self._request("POST", "/servers", timeout=timeout_s, content=body)
        try:
            return ServerInfo.model_validate(answer)
        except ValidationError as exc:
            raise LauncherError(f"the launcher's /servers answer is malformed: {exc}") from exc

    async def servers(self) -> list[ServerInfo]:
        """`GET /servers`: the warm servers alive, with their resident memory."""
        answer = await self._request("GET", "/servers")
        rows = answer.get("servers") if isinstance(answer, dict) else None
        if not isinstance(rows, list):
            raise LauncherError("the launcher's /servers answer is not a list")
        try:
            return [ServerInfo.model_validate(row) for row in rows]
        except ValidationError as exc:
            raise LauncherError(f"the launcher's /servers answer is malformed: {exc}") from exc

    async def sweep_server(self, agent_id: str) -> tuple[int, int | None]:
        """`POST /servers/{id}/sweep`: kill what the turn left behind.

        How many were killed, and the server's resident memory after.
        """
        answer = await self._request("POST", f"/servers/{agent_id}/sweep")
        answer = answer if isinstance(answer, dict) else {}
        killed, rss = answer.get("killed"), answer.get("rss_bytes")
        return (killed if isinstance(killed, int) else 0, rss if isinstance(rss, int) else None)

    async def server_limit_hit(self, agent_id: str) -> str | None:
        """`GET /servers/{id}/limit`: the resource limit the server ran into (it is killed then).

        One of the exit frame's limit reasons, or None; a server already gone (404) is None.
        """
        try:
            answer = await self._request("GET", f"/servers/{agent_id}/limit")
        except LauncherRefused as exc:
            if exc.status != 404:
                raise
            return None
        hit = answer.get("limit_hit") if isinstance(answer, dict) else None
        return hit if hit in LIMIT_HITS else None

    async def stop_server(self, agent_id: str) -> None:
        """`POST /servers/{id}/stop`; a server already gone (404) is not an error."""
        try:
            await self._request("POST", f"/servers/{agent_id}/stop", timeout=15.0)
        except LauncherRefused as exc:
            if exc.status != 404:
                raise

    async def stop(self, run_id: str) -> None:
        """`POST /runs/{id}/stop`: SIGINT to the run's group, SIGKILL after 2 s.

        A run that already ended (404) is not an error.
        """
        try:
            await self._request("POST", f"/runs/{run_id}/stop")
        except LauncherRefused as exc:
            if exc.status != 404:
                raise

    async def run(self, request: RunRequest) -> AsyncGenerator[Frame, None]:
        """`POST /runs`: yield the run's frames as they arrive; the last is `exit`.

        Leaving the iteration early closes the connection, which makes the
        launcher stop the run (no orphan engines). Raises `LauncherRefused`
        for a refused request, `LauncherUnavailable` when the launcher is
        gone, `LauncherError` for a broken stream (no `exit` frame).
        """
        body = orjson.dumps(request.model_dump(mode="json"))
        headers = {"Content-Type": "application/json"}
        timeout = httpx.Timeout(10.0, read=None)
        try:
            async with self._client.stream(
                "POST", "/runs", content=body, headers=headers, timeout=timeout
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise _refused(response)
                saw_exit = False
                async for line in split_lines(response.aiter_raw(), FRAME_LIMIT):
                    if not line.strip():
                        continue
                    frame = frame_of(line)
                    yield frame
                    if isinstance(frame, ExitFrame):
                        saw_exit = True
                        break
                if not saw_exit:
                    raise LauncherUnavailable(
                        "the launcher ended the run's stream without an exit frame "
                        "(did the launcher die?)"
                    )
        except httpx.ConnectError as exc:
            # Only connecting can raise this: no run was started, so it may be sent again.
            raise LauncherNotListening(
                f"cannot reach the launcher at {self.socket_path}: {exc}"
            ) from exc
        except httpx.TransportError as exc:
            raise LauncherUnavailable(f"lost the launcher during a run: {exc}") from exc

    async def _request(
        self, method: str, path: str, timeout: float | None = None, content: bytes | None = None
    ) -> Any:
        headers = {"Content-Type": "application/json"} if content is not None else None
        try:
            response = await self._client.request(
                method,
                path,
                content=content,
                headers=headers,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TransportError as exc:
            raise LauncherUnavailable(
                f"cannot reach the launcher at {self.socket_path}: {exc}"
            ) from exc
        if response.status_code >= 400:
            raise _refused(response)
        if response.status_code == 204 or not response.content:
            return {}
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            raise LauncherError(f"the launcher answered {path} with non-JSON: {exc}") from exc


def _refused(response: httpx.Response) -> LauncherRefused:
    code, message = "error", f"HTTP {response.status_code}"
    try:
        err = orjson.loads(response.content).get("error", {})
        code = str(err.get("code") or code)
        message = str(err.get("message") or message)
    except (orjson.JSONDecodeError, AttributeError):
        text = response.content[:300].decode("utf-8", "replace").strip()
        message = text or message
    return LauncherRefused(response.status_code, code, message)


def _validate(model: type[LauncherHealth], answer: Any) -> LauncherHealth:
    try:
        return model.model_validate(answer)
    except ValidationError as exc:
        raise LauncherError(f"the launcher's answer is malformed: {exc}") from exc


# ---- the launcher process ----


# `python -I` ignores PYTHONPATH, the working directory and the user's site-packages, so
# nothing in the environment can change the code the launcher runs; but a `pip install
# --user` Computer lives in the user's site-packages. The launcher therefore imports from
# exactly the directories this interpreter already imports from (its `sys.path`, passed
# in its argv), however the package was installed: a venv, pipx or `--user`.
LAUNCHER_BOOT = (
    "import json, runpy, sys; module = sys.argv.pop(1); sys.path[:] = json.loads(sys.argv.pop(1)); "
    "runpy.run_module(module, run_name='__main__', alter_sys=True)"
)


def import_path() -> list[str]:
    """This interpreter's import directories, absolute (a relative entry would follow the cwd)."""
    return [entry for entry in sys.path if entry and Path(entry).is_absolute()]


def launcher_command(module: str = "sandbox_launcher") -> list[str]:
    """`python -I` running `module` with this interpreter's import path (`LAUNCHER_BOOT`)."""
    return [sys.executable, "-I", "-c", LAUNCHER_BOOT, module, orjson.dumps(import_path()).decode()]


def launcher_argv(
    crew_home: Path,
    run_id: str,
    socket_path: Path,
    *,
    mode: str | None = None,
    opencode_path: str | None = None,
    read_only_roots: tuple[Path, ...] = (),
    limit_args: list[str] | None = None,
) -> list[str]:
    """The launcher's command line (docs/contracts.md): this interpreter, isolated.

    `limit_args`: the turn limits' flags (`bootstrap.TurnLimits.launcher_args`).
    """
    argv = [
        *launcher_command(),
        "serve",
        "--crew-home",
        str(crew_home),
        "--run-id",
        run_id,
        "--socket",
        str(socket_path),
    ]
    if mode:
        argv += ["--mode", mode]
    if opencode_path:
        argv += ["--opencode", opencode_path]
    for root in read_only_roots:
        argv += ["--read-only-root", str(root)]
    return argv + (limit_args or [])


def check_launcher_starts(timeout_s: float = 30.0) -> None:
    """Run the launcher's `--version` as the Computer will start it; `LauncherUnavailable` if not.

    Checked before `ready`: an installation whose launcher cannot even start (a
    package the isolated interpreter cannot import) can run no agent at all.
    """
    argv = [*launcher_command(), "--version"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LauncherUnavailable(f"the sandbox launcher cannot start: {exc}") from exc
    if done.returncode != 0 or not done.stdout.startswith("crew-launcher "):
        said = (done.stderr.strip().splitlines() or [done.stdout.strip() or "nothing"])[-1]
        raise LauncherUnavailable(
            f"the sandbox launcher cannot start with {sys.executable} (exit status "
            f"{done.returncode}: {said[:300]}); reinstall crew-computer (README: Install)"
        )


class LauncherProcess:
    """The launcher as a child process: start, wait for `ready`, stop by closing stdin.

    Use `start()` then `client()`; `wait()` returns when it dies (exit code),
    so the owner can notice a dead launcher and start a new one.
    """

    def __init__(
        self,
        argv: list[str],
        socket_path: Path,
        env: Mapping[str, str] | None = None,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        self.argv = argv
        self.stop_grace_s = stop_grace_s
        self.socket_path = socket_path
        self.secret = secrets.token_urlsafe(32)
        self._env = dict(env) if env is not None else None
        self._process: Process | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def returncode(self) -> int | None:
        return self._process.returncode if self._process else None

    async def start(self, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start the launcher, hand it the secret, wait for its `ready` line.

        Raises `LauncherUnavailable` when it exits or stays silent.
        """
        self._process = await anyio.open_process(
            self.argv,
            stdin=-1,
            stdout=-1,
            stderr=None,  # its log lines go to our stderr
            env=self._env,
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        try:
            await self._process.stdin.send(self.secret.encode() + b"\n")
            line = b""
            with anyio.fail_after(ready_timeout_s):
                while not line.endswith(b"\n"):
                    try:
                        line += await self._process.stdout.receive(64)
                    except (anyio.EndOfStream, anyio.ClosedResourceError):
                        break
        except TimeoutError:
            await self.stop()
            raise LauncherUnavailable(
                f"the launcher did not say ready within {ready_timeout_s:.0f} s"
            ) from None
        except (anyio.BrokenResourceError, OSError) as exc:
            await self.stop()
            raise LauncherUnavailable(f"the launcher died at start: {exc}") from exc
        if line.strip() != b"ready":
            code = await self.stop()
            raise LauncherUnavailable(
                f"the launcher exited before it was ready (exit status {code}, "
                f"said {line[:200].decode('utf-8', 'replace').strip()!r}); see its log above"
            )

    def client(self) -> LauncherClient:
        """A client for this launcher's socket and secret."""
        return LauncherClient(self.socket_path, self.secret)

    async def wait(self) -> int:
        """Wait until the launcher exits; its exit status."""
        if self._process is None:
            raise LauncherUnavailable("the launcher was never started")
        return await self._process.wait()

    async def stop(self, grace_s: float | None = None) -> int | None:
        """Close its stdin (its signal to exit), then SIGTERM, then SIGKILL; its exit status."""
        grace_s = self.stop_grace_s if grace_s is None else grace_s
        proc = self._process
        if proc is None:
            return None
        with anyio.CancelScope(shield=True):
            if proc.stdin is not None:
                with contextlib.suppress(anyio.BrokenResourceError, OSError):
                    await proc.stdin.aclose()
            for sig, then in ((None, "SIGTERM"), (signal.SIGTERM, "SIGKILL"), (signal.SIGKILL, "")):
                if sig is not None and proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(sig)
                with anyio.move_on_after(grace_s):
                    await proc.wait()
                if proc.returncode is not None or not then:
                    break
                log.warning("the launcher did not exit in %.0f s; sending %s", grace_s, then)
            if proc.stdout is not None:
                with contextlib.suppress(anyio.BrokenResourceError, OSError):
                    await proc.stdout.aclose()
        return proc.returncode
