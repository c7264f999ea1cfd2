"""In-process fixtures for the reference server: a `:memory:` store, a frozen clock, ASGI client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from asgi_lifespan import LifespanManager

from crew_server.app import create_app
from crew_server.clock import Clock
from crew_server.store import Store
from tests.server.world import World

START = datetime(2026, 10, 5, 9, 0, tzinfo=UTC)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def world() -> AsyncIterator[World]:
    """A dev-mode app on `:memory:` with a frozen clock and its reminder scheduler running."""
    clock = Clock(START)
    store = Store(":memory:", clock)
    app = create_app(store, clock, dev=True)
    async with LifespanManager(app) as manager, World.open(manager.app, store, clock) as w:
        yield w
    store.close()


@pytest.fixture
async def small_claims_world() -> AsyncIterator[World]:
    """As `world`, with unread claims (and HELD answers) bound to 3 messages and 100 characters."""
    clock = Clock(START)
    store = Store(":memory:", clock, claim_max_messages=3, claim_max_chars=100)
    app = create_app(store, clock, dev=True)
    async with LifespanManager(app) as manager, World.open(manager.app, store, clock) as w:
        yield w
    store.close()
