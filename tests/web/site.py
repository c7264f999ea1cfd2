"""An in-process site for the web app's tests: a signed-out browser and the user API
(httpx over ASGI) on one server; `conftest.py` makes `site` a fixture."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
import httpx
import orjson
import pytest
from asgi_lifespan import LifespanManager

from crew_harness.waiting import wait_until_async
from crew_server.app import EventHub, create_app
from crew_server.clock import Clock
from crew_server.store import Store


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Site:
    """A signed-out browser and the user token, on an in-process server."""

    browser: httpx.AsyncClient
    api: httpx.AsyncClient
    store: Store
    token: str

    async def sign_in(self) -> str:
        """Sign in through the form; the CSRF token of the session."""
        form = await self.browser.get("/login")
        sign_in = hidden(form.text, "sign_in")
        answer = await self.browser.post(
            "/login", data={"sign_in": sign_in, "token": self.token, "next": "/rooms"}
        )
        assert answer.status_code == 303, answer.text
        rooms = await self.browser.get("/rooms")
        return hidden(rooms.text, "csrf")

    async def agent(self, handle: str, computer_id: str | None = None) -> dict[str, str]:
        body = {"handle": handle, "name": handle.title(), "model": "local/scripted"}
        if computer_id:
            body["computer_id"] = computer_id
        answer = await self.api.post("/api/agents", json=body)
        assert answer.status_code == 201, answer.text
        agent: dict[str, str] = answer.json()
        return agent


def hidden(page: str, name: str) -> str:
    found = re.search(rf'name="{name}" value="([^"]*)"', page)
    assert found, f"no hidden {name} field in the page"
    return found.group(1)


@contextlib.asynccontextmanager
async def served(location: str) -> AsyncIterator[tuple[Site, EventHub]]:
    """A site on the store at `location`, and the event hub its server closes to stop."""
    clock = Clock(datetime(2026, 10, 5, 9, 0, tzinfo=UTC))
    store = Store(location, clock)
    token = store.ensure_user_token()
    assert token is not None
    app = create_app(store, clock)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://testserver") as browser,
            httpx.AsyncClient(
                transport=transport,
                base_url="http://testserver",
                headers={"Authorization": f"Bearer {token}"},
            ) as api,
        ):
            yield Site(browser, api, store, token), app.state.hub
    store.close()


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    async with served(":memory:") as (started, _):
        yield started


class RawStream:
    """A GET on the ASGI app read as it comes (httpx's ASGI transport buffers whole
    answers, which a live stream never finishes)."""

    def __init__(self, app: Any, path: str, cookies: httpx.Cookies) -> None:
        self.app, self.path = app, path
        self.cookie = "; ".join(f"{k}={v}" for k, v in cookies.items())
        self.sent: list[dict[str, Any]] = []
        self.done = anyio.Event()
        self.gone = anyio.Event()

    async def run(self) -> None:
        path, _, query = self.path.partition("?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(b"host", b"testserver"), (b"cookie", self.cookie.encode())],
            "client": ("127.0.0.1", 1),
            "server": ("testserver", 80),
        }

        async def receive() -> dict[str, Any]:
            await self.gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            self.sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.done.set()

        await self.app(scope, receive, send)
        self.done.set()

    def text(self) -> str:
        chunks = [m.get("body", b"") for m in self.sent if m["type"] == "http.response.body"]
        return b"".join(chunks).decode()


def updates_in(stream: RawStream) -> list[dict[str, Any]]:
    """The `update` events the stream sent so far."""
    return [
        orjson.loads(line[len("data: ") :])
        for line in stream.text().splitlines()
        if line.startswith("data: ")
    ]


async def open_browser_stream(site: Site, tasks: anyio.abc.TaskGroup) -> tuple[RawStream, str]:
    """This browser's `GET /live`, started, and its id (its first event, `hello`)."""
    app = site.browser._transport.app  # type: ignore[attr-defined]
    stream = RawStream(app, "/live", site.browser.cookies)
    tasks.start_soon(stream.run)
    hello = await wait_until_async("the stream's hello", lambda: updates_in(stream))
    assert stream.sent[0]["status"] == 200 and hello[0]["mode"] == "hello"
    return stream, str(hello[0]["stream"])


async def subscribe(
    site: Site, csrf: str, stream_id: str, key: str, topic: str, **more: str
) -> httpx.Response:
    """A tab's topic on the browser's stream (`POST /live/subscriptions`, as app.js sends it)."""
    return await site.browser.post(
        "/live/subscriptions",
        data={"csrf": csrf, "stream": stream_id, "key": key, "topic": topic, **more},
        headers={"X-Crew-Fetch": "1"},
    )
