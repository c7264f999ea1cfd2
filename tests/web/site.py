"""An in-process site for the web app's tests: a signed-out browser and the user API
(httpx over ASGI) on one server; `conftest.py` makes `site` a fixture."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import pytest
from asgi_lifespan import LifespanManager

from crew_server.app import create_app
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


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    clock = Clock(datetime(2026, 10, 5, 9, 0, tzinfo=UTC))
    store = Store(":memory:", clock)
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
            yield Site(browser, api, store, token)
    store.close()
