"""The `/events` bus: numbered events, replay from `Last-Event-ID`, and `missed` instead of silence."""

from __future__ import annotations

from datetime import date
from typing import Any

import anyio
import httpx
import pytest

from computer_service.engine.base import Usage
from computer_service.event_bus import BadEventId, BusEvent, EventBus
from computer_service.introspection import create_app
from computer_service.metrics import Metrics
from tests.computer.static_view import StaticView

pytestmark = pytest.mark.anyio


async def take(bus: EventBus, cursor: int, count: int) -> list[Any]:
    """The first `count` items a reader at `cursor` gets (events and `missed` notices)."""
    got: list[Any] = []
    async for item in bus.follow(cursor, ping_s=60):
        if item is not None:
            got.append(item)
        if len(got) == count:
            break
    return got


def numbers(items: list[Any]) -> list[int]:
    return [item.n for item in items if isinstance(item, BusEvent)]


async def test_a_reconnect_with_its_last_id_gets_what_came_after() -> None:
    bus = EventBus(stream="s1")
    for n in range(5):
        bus.publish("state", {"n": n})
    assert bus.last_id == "s1-5"
    cursor, notice = bus.cursor_for("s1-2")
    assert notice is None
    got = await take(bus, cursor, 3)
    assert numbers(got) == [3, 4, 5]
    assert [item.data for item in got] == [{"n": 2}, {"n": 3}, {"n": 4}]
    # Without an id the stream starts live: nothing old.
    live, _ = bus.cursor_for(None)
    bus.publish("state", {"n": 5})
    assert numbers(await take(bus, live, 1)) == [6]


async def test_an_id_older_than_the_ring_is_told_how_many_it_missed() -> None:
    bus = EventBus(ring_size=10, stream="s1")
    for n in range(25):
        bus.publish("engine", {"n": n})
    cursor, notice = bus.cursor_for("s1-3")
    assert notice is None
    got = await take(bus, cursor, 11)
    # Events 4..15 fell out of the ring: said, then 16..25.
    assert got[0] == {"count": 12, "reason": "this reader fell more than 10 events behind"}
    assert numbers(got[1:]) == list(range(16, 26))
    assert bus.missed_total == 12


async def test_a_slow_reader_loses_nothing_silently() -> None:
    bus = EventBus(stream="s1")
    got: list[Any] = []

    async def reader(cursor: int) -> None:
        async for item in bus.follow(cursor, ping_s=60):
            got.append(item)
            if isinstance(item, BusEvent) and item.n == 2000:
                return

    cursor, _ = bus.cursor_for(None)
    # The reader is subscribed but gets no turn to run while 2,000 events go out.
    for n in range(2000):
        bus.publish("state", {"n": n})
    await reader(cursor)
    missed = [item for item in got if isinstance(item, dict)]
    assert missed == [{"count": 976, "reason": "this reader fell more than 1024 events behind"}]
    assert numbers(got) == list(range(977, 2001))
    assert missed[0]["count"] + len(numbers(got)) == 2000  # every event: received or counted


async def test_an_id_of_a_computer_that_restarted_replays_what_this_one_kept() -> None:
    bus = EventBus(stream="new")
    bus.publish("state", {"n": 0})
    bus.publish("state", {"n": 1})
    cursor, notice = bus.cursor_for("old-41")
    assert notice is not None and notice["count"] is None and "restarted" in notice["reason"]
    assert numbers(await take(bus, cursor, 2)) == [1, 2]


@pytest.mark.parametrize("bad", ["", "12", "s1-", "s1-x", "-4", "s1-" + "9" * 30])
def test_a_malformed_id_is_refused(bad: str) -> None:
    with pytest.raises(BadEventId):
        EventBus(stream="s1").cursor_for(bad)


async def test_the_app_refuses_a_malformed_id_and_unknown_query_parameters() -> None:
    app = create_app(StaticView(), EventBus(stream="s1"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://computer") as client:
        refused = await client.get("/events", headers={"Last-Event-ID": "garbage"})
        assert refused.status_code == 400
        assert "Last-Event-ID" in refused.json()["error"]["message"]
        query = await client.get("/health?verbose=1")
        assert query.status_code == 400 and "verbose" in query.json()["error"]["message"]


async def test_close_ends_every_reader() -> None:
    bus = EventBus()
    ended = anyio.Event()

    async def reader() -> None:
        async for _ in bus.follow(0, ping_s=60):
            pass
        ended.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        await anyio.wait_all_tasks_blocked()
        assert bus.readers == 1
        bus.close()
        await ended.wait()
    assert bus.readers == 0


def test_usage_today_starts_again_at_midnight() -> None:
    metrics = Metrics()
    day = date(2026, 3, 1)
    metrics.clock = lambda: day
    metrics.usage_reported("a1", "alice", Usage(input_tokens=5, cost=0.5))
    assert (metrics.today("a1").input_tokens, metrics.today("a1").turns) == (5, 1)
    day = date(2026, 3, 2)
    assert metrics.today("a1").turns == 0
    metrics.usage_reported("a1", "alice", Usage(output_tokens=1))
    assert (metrics.today("a1").output_tokens, metrics.today("a1").input_tokens) == (1, 0)
    # The counters since start do not reset.
    assert (metrics.usage["a1"].input_tokens, metrics.usage["a1"].turns) == (5, 2)
