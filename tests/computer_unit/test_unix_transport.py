"""The launcher client's Unix socket transport (`computer_service.unix_transport`).

A read cancelled in the very loop iteration in which its socket became readable
must leave no error behind: with httpx's own `uds=` transport (anyio 4.16's raw
socket stream) the selector's callback then completes the cancelled future and
asyncio reports `InvalidStateError` — what made a step-guard test fail at random.
The test makes that iteration happen on purpose: a cancelling callback on another
descriptor that became readable first (epoll reports in the order of readiness),
then the answer's next chunk. And the pool still serves the next request."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from computer_service.unix_transport import unix_transport

CHUNK = b"x" * 512


def _chunk() -> bytes:
    return b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK)


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_a_read_cancelled_as_its_socket_turns_readable_leaves_no_error(
    tmp_path: Path,
) -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET /ok "):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + _chunk())
            writers.append(writer)  # the test writes the next chunk itself
        await writer.drain()

    path = tmp_path / "s.sock"
    server = await asyncio.start_unix_server(serve, path=str(path))
    trigger_r, trigger_w = os.pipe()
    try:
        async with httpx.AsyncClient(
            transport=unix_transport(str(path)), base_url="http://test"
        ) as client:
            for _ in range(20):
                first = asyncio.Event()

                async def read_forever(first: asyncio.Event = first) -> None:
                    async with client.stream("GET", "/stream") as response:
                        async for _ in response.aiter_raw():
                            first.set()

                task = asyncio.create_task(read_forever())
                await first.wait()
                for _ in range(10):  # the reader is waiting on an empty socket now
                    await asyncio.sleep(0)

                def cancel(task: asyncio.Task[None] = task) -> None:
                    loop.remove_reader(trigger_r)  # once
                    task.cancel()

                loop.add_reader(trigger_r, cancel)
                os.write(trigger_w, b"!")  # readable first: its callback runs first
                writers[-1].transport.write(_chunk())  # sent at once: readable second
                with pytest.raises(asyncio.CancelledError):
                    await task
                os.read(trigger_r, 1)
            answer = await client.get("/ok")  # positive control: the pool still answers
            assert (answer.status_code, answer.text) == (200, "ok")
        for _ in range(5):
            await asyncio.sleep(0)
    finally:
        os.close(trigger_r)
        os.close(trigger_w)
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()
        loop.set_exception_handler(previous)
    assert errors == [], [c.get("message") or repr(c.get("exception")) for c in errors]


@pytest.mark.anyio
async def test_no_socket_is_a_connect_error(tmp_path: Path) -> None:
    async with httpx.AsyncClient(
        transport=unix_transport(str(tmp_path / "none.sock")), base_url="http://test"
    ) as client:
        with pytest.raises(httpx.ConnectError, match=r"none\.sock"):
            await client.get("/ok")
