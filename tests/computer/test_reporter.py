"""RunReporter: ordered, non-overlapping batches; events wait (bounded) for a server that is away,
a refused batch is dropped, the turn goes on."""

from __future__ import annotations

from typing import Any

import anyio
import orjson
import pytest

from computer_service.engine.base import EngineEvent
from computer_service.metrics import Metrics
from computer_service.reporter import MAX_BATCH_BYTES, MAX_BATCH_EVENTS, RunReporter
from computer_service.upstream import StaleTurn, UpstreamRejected, UpstreamUnavailable

pytestmark = pytest.mark.anyio


def event(n: int) -> EngineEvent:
    return EngineEvent(type="text", at="2026-01-01T00:00:00+00:00", data={"text": str(n)})


class RecordingSender:
    """Records batches; can hold a batch in flight and fail chosen batches."""

    def __init__(self, fail: dict[int, Exception] | None = None) -> None:
        self.batches: list[tuple[int, list[str]]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.release = anyio.Event()
        self.entered = anyio.Event()
        self.hold_first = False
        self.fail = fail or {}

    async def __call__(self, first_index: int, events: list[dict[str, Any]]) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            call = len(self.batches)
            self.batches.append((first_index, [e["data"]["text"] for e in events]))
            if call == 0 and self.hold_first:
                self.entered.set()
                await self.release.wait()
            if call in self.fail:
                raise self.fail[call]
        finally:
            self.in_flight -= 1


async def test_events_arriving_in_flight_form_the_next_batch_in_order() -> None:
    sender = RecordingSender()
    sender.hold_first = True
    metrics = Metrics()
    async with RunReporter(sender, metrics) as reporter:
        await reporter.report(event(0))
        await sender.entered.wait()
        for n in range(1, 6):
            await reporter.report(event(n))
        sender.release.set()
    assert sender.batches == [(0, ["0"]), (1, ["1", "2", "3", "4", "5"])]
    assert sender.max_in_flight == 1
    assert metrics.batches_sent == 2 and metrics.batches_dropped == 0
    assert metrics.events_reported == 6


async def test_a_refused_batch_is_dropped_and_later_batches_keep_their_indexes() -> None:
    sender = RecordingSender(fail={0: UpstreamRejected("bad request", status=400)})
    sender.hold_first = True
    metrics = Metrics()
    async with RunReporter(sender, metrics) as reporter:
        await reporter.report(event(0))
        await reporter.report(event(1))
        await sender.entered.wait()
        await reporter.report(event(2))
        sender.release.set()
    # The dropped batch leaves a gap (indexes 0-1); the next starts at 2.
    assert sender.batches == [(0, ["0", "1"]), (2, ["2"])]
    assert reporter.batches_dropped == 1 and reporter.batches_sent == 1
    assert reporter.events_lost == 2
    assert metrics.batches_dropped == 1


async def test_events_wait_for_a_server_that_is_away_and_go_out_in_order() -> None:
    away = UpstreamUnavailable("connection refused")
    sender = RecordingSender(fail={0: away, 1: away, 2: away})
    sender.hold_first = True
    async with RunReporter(sender, Metrics()) as reporter:
        await reporter.report(event(0))
        await sender.entered.wait()
        for n in range(1, 4):
            await reporter.report(event(n))
        sender.release.set()
    # Tried again from index 0 with what arrived meanwhile; nothing lost.
    assert sender.batches[0] == (0, ["0"])
    assert sender.batches[-1] == (0, ["0", "1", "2", "3"])
    assert all(first == 0 for first, _ in sender.batches)
    assert reporter.events_lost == 0 and reporter.batches_dropped == 0


async def test_past_the_bound_the_oldest_waiting_events_are_dropped_as_a_gap() -> None:
    away = UpstreamUnavailable("connection refused")
    sender = RecordingSender(fail={0: away, 1: away})
    sender.hold_first = True
    async with RunReporter(sender, Metrics(), max_kept_events=3) as reporter:
        await reporter.report(event(0))
        await sender.entered.wait()
        for n in range(1, 6):
            await reporter.report(event(n))
        sender.release.set()
    # Six events, three may wait: 0-2 are lost, the server sees the batch start at 3 (a gap).
    assert sender.batches[-1] == (3, ["3", "4", "5"])
    assert reporter.events_lost == 3 and reporter.event_count == 6


async def test_at_the_end_the_rest_waits_for_the_server_only_the_flush_window() -> None:
    away = UpstreamUnavailable("connection refused")
    sender = RecordingSender(fail={n: away for n in range(1000)})
    async with RunReporter(sender, Metrics(), flush_window_s=0.0) as reporter:
        await reporter.report(event(0))
        await reporter.report(event(1))
    # Given up at the end: counted lost (the finish's event_count makes it a gap).
    assert reporter.events_lost == 2 and reporter.event_count == 2


async def test_abandon_stops_the_wait_at_once() -> None:
    away = UpstreamUnavailable("connection refused")
    sender = RecordingSender(fail={n: away for n in range(1000)})
    with anyio.fail_after(10):
        async with RunReporter(sender, Metrics(), flush_window_s=3600) as reporter:
            await reporter.report(event(0))
            reporter.abandon()
    assert reporter.events_lost == 1


async def test_close_flushes_everything_and_a_flood_is_split_in_order() -> None:
    sender = RecordingSender()
    total = MAX_BATCH_EVENTS * 2 + 7
    async with RunReporter(sender, Metrics()) as reporter:
        for n in range(total):
            await reporter.report(event(n))
    flat = [text for _, texts in sender.batches for text in texts]
    assert flat == [str(n) for n in range(total)]
    indexes = [first for first, _ in sender.batches]
    sizes = [len(texts) for _, texts in sender.batches]
    assert indexes == [sum(sizes[:i]) for i in range(len(sizes))]
    assert max(sizes) <= MAX_BATCH_EVENTS
    assert sender.max_in_flight == 1


async def test_batches_of_large_events_stay_under_the_byte_cap() -> None:
    """4,096-character tool texts of 4-byte characters: 2,000 of them would be ~32 MiB."""
    bodies: list[int] = []

    async def send(first_index: int, events: list[dict[str, Any]]) -> None:
        bodies.append(len(orjson.dumps({"fence": 1, "first_index": first_index, "events": events})))

    big = "😀" * 4096
    async with RunReporter(send, Metrics()) as reporter:
        for _ in range(300):
            await reporter.report(
                EngineEvent(type="text", at="2026-01-01T00:00:00+00:00", data={"text": big})
            )
    assert len(bodies) > 1
    assert max(bodies) <= MAX_BATCH_BYTES + 1024 < 1024 * 1024
    assert sum(bodies) > 300 * 4096 * 4


async def test_stale_turn_calls_back_once_and_sends_nothing_more() -> None:
    sender = RecordingSender(fail={0: StaleTurn("stale", status=409, code="stale_turn")})
    sender.hold_first = True
    stale_calls = []
    async with RunReporter(sender, Metrics(), on_stale=lambda: stale_calls.append(1)) as reporter:
        await reporter.report(event(0))
        await sender.entered.wait()
        await reporter.report(event(1))
        sender.release.set()
    assert stale_calls == [1]
    assert reporter.stale
    assert len(sender.batches) == 1  # the batch after the stale answer was never sent
    assert reporter.batches_dropped == 2


async def test_no_events_no_request() -> None:
    sender = RecordingSender()
    async with RunReporter(sender, Metrics()):
        pass
    assert sender.batches == []
