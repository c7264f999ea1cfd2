"""The Computer's client of the sandbox launcher's API (`LauncherClient`) and its errors.

The launcher is the only process that starts sandboxed engines (launcher.md);
`launcher_process.py` starts it. The client speaks HTTP+JSON to it over its
private Unix socket with the bearer secret, building requests and parsing
answers with the launcher's own models (`crew_common.launcher_wire`). A run
streams NDJSON frames: `started`, one `line` per engine stdout line, `log`
lines about model requests, and a final `exit`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
from pydantic import ValidationError

from computer_service.unix_transport import unix_transport
from crew_common.launcher_wire import (
    DEFAULT_STDOUT_LIMIT,
    LIMIT_HITS,
    Denials,
    DeniedFrame,
    ExitFrame,
    Frame,
    Health,
    LimitHit,
    LineFrame,
    LogFrame,
    ModelsRequest,
    RunRequest,
    ServerInfo,
    ServerRequest,
    StartedFrame,
)

# A `line` frame carries one stdout line as a JSON string; escaping can grow it
# up to 6× (\u00XX), so frames get a generous cap of their own.
FRAME_LIMIT = 6 * DEFAULT_STDOUT_LIMIT + 4096


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
        if kind == "denied":
            return DeniedFrame.model_validate(obj)
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
            # A Unix socket read with asyncio's streams (unix_transport.py); no TLS.
            transport=unix_transport(self.socket_path),
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

    async def health(self) -> Health:
        """`GET /health`."""
        answer = await self._request("GET", "/health")
        try:
            return Health.model_validate(answer)
        except ValidationError as exc:
            raise LauncherError(f"the launcher's answer is malformed: {exc}") from exc

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

    async def server_limit_hit(self, agent_id: str) -> LimitHit | None:
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
        return next((known for known in LIMIT_HITS if known == hit), None)

    async def server_denials(self, agent_id: str) -> list[DeniedFrame]:
        """`POST /servers/{id}/denials`: what its firewall refused since the last call (drained).

        A server already gone (404) has none left to tell.
        """
        try:
            answer = await self._request("POST", f"/servers/{agent_id}/denials")
        except LauncherRefused as exc:
            if exc.status != 404:
                raise
            return []
        try:
            return Denials.model_validate(answer).denials
        except ValidationError as exc:
            raise LauncherError(f"the launcher's denials answer is malformed: {exc}") from exc

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
