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
