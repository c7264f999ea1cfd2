"""A tiny upstream in front of the real crew server whose event stream the test writes.

Every request but `GET /computer/events` is passed on to the real server (and its
answer back, unless the test asked to garble it). The
event stream is the test's own: it opens with `: connected`, then carries
exactly the bytes the test injects (garbage included) until the test closes it.
Runs uvicorn in a thread; `inject()` and `close_stream()` are thread-safe.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from crew_harness.ports import free_port
from crew_harness.waiting import wait_until

_CLOSE = b""


class SSEProxy:
    """`url` for the Computer's bootstrap.

    `streams` holds the request headers of each stream served, `refused` those
    of the requests the real server refused.
    """

    def __init__(self, upstream_url: str) -> None:
        self.upstream_url = upstream_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.streams: list[dict[str, str]] = []
        # (method, path suffix) → how many more answers to garble.
        self._garble: dict[tuple[str, str], int] = {}
        self.garbled: list[str] = []
        self.refused: list[dict[str, str]] = []
        self._queues: list[asyncio.Queue[bytes]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        app = Starlette(
            routes=[
                Route("/computer/events", self._events, methods=["GET"]),
                Route("/{path:path}", self._forward, methods=["GET", "POST", "PUT", "DELETE"]),
            ]
        )
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def start(self) -> SSEProxy:
        self._thread.start()

        def started() -> bool:
            if not self._thread.is_alive():
                raise RuntimeError("the SSE proxy did not start")
            return self._server.started

        wait_until("the SSE proxy to start", started, 10)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._server.force_exit = True
        for queue in self._queues:
            self._put(queue, _CLOSE)
        self._thread.join(timeout=10)

    def inject(self, raw: bytes) -> None:
        """Write `raw` as it is into the newest event stream."""
        assert raw, "nothing to inject"
        self._put(self._queues[-1], raw)

    def garble(self, method: str, path_suffix: str, times: int = 1) -> None:
        """Pass the next `times` such requests on, but answer the Computer 200 with garbage."""
        self._garble[(method, path_suffix)] = times

    def close_stream(self) -> None:
        """End the newest event stream (the Computer should reconnect)."""
        self._put(self._queues[-1], _CLOSE)

    def _put(self, queue: asyncio.Queue[bytes], raw: bytes) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(queue.put_nowait, raw)

    async def _events(self, request: Request) -> Response:
        self._loop = asyncio.get_running_loop()
        # The real server judges the request (token, Last-Event-ID); its refusals pass on.
        async with (
            httpx.AsyncClient(base_url=self.upstream_url, timeout=30) as client,
            client.stream("GET", "/computer/events", headers=_passed_on(request)) as answer,
        ):
            if answer.status_code != 200:
                content = await answer.aread()
                self.refused.append(dict(request.headers))
                return Response(content, answer.status_code, headers=_content_type(answer))
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._queues.append(queue)
        self.streams.append(dict(request.headers))

        async def body() -> AsyncIterator[bytes]:
            yield b": connected\n\n"
            while (raw := await queue.get()) != _CLOSE:
                yield raw

        return StreamingResponse(body(), media_type="text/event-stream")

    async def _forward(self, request: Request) -> Response:
        async with httpx.AsyncClient(base_url=self.upstream_url, timeout=30) as client:
            answer = await client.request(
                request.method,
                request.url.path,
                params=request.query_params,
                content=await request.body(),
                headers=_passed_on(request),
            )
        for (method, suffix), left in self._garble.items():
            if left and request.method == method and request.url.path.endswith(suffix):
                self._garble[(method, suffix)] = left - 1
                self.garbled.append(f"{method} {request.url.path}")
                return Response(b"<html>502 oops", 200, media_type="application/json")
        return Response(answer.content, answer.status_code, headers=_content_type(answer))


def _passed_on(request: Request) -> dict[str, str]:
    kept = ("authorization", "content-type", "last-event-id", "crew-epoch")
    return {k: v for k, v in request.headers.items() if k.lower() in kept}


def _content_type(answer: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in answer.headers.items() if k.lower() == "content-type"}
