"""In-process fixtures for the reference server: a store on each backend (SQLite
`:memory:`, a fresh PostgreSQL schema), a frozen clock, an ASGI client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from asgi_lifespan import LifespanManager

from crew_server.app import create_app
from crew_server.clock import Clock
from crew_server.store import Store
from tests.server.world import World
from tests.support.postgres import BACKENDS, location_for

START = datetime(2026, 10, 5, 9, 0, tzinfo=UTC)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=BACKENDS)
def store_location(request: pytest.FixtureRequest) -> str:
    """The location of a fresh, empty store, once per backend."""
    return location_for(request.param, request)


@pytest.fixture
async def world(store_location: str) -> AsyncIterator[World]:
    """A dev-mode app on a fresh store with a frozen clock and its reminder scheduler running."""
    clock = Clock(START)
    store = Store(store_location, clock)
    app = create_app(store, clock, dev=True)
    async with LifespanManager(app) as manager, World.open(manager.app, store, clock) as w:
        yield w
    store.close()


@pytest.fixture
async def small_claims_world(store_location: str) -> AsyncIterator[World]:
    """As `world`, with unread claims (and HELD answers) bound to 3 messages and 100 characters."""
    clock = Clock(START)
    store = Store(store_location, clock, claim_max_messages=3, claim_max_chars=100)
    app = create_app(store, clock, dev=True)
    async with LifespanManager(app) as manager, World.open(manager.app, store, clock) as w:
        yield w
    store.close()
