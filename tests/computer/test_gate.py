"""TurnGate: at most `capacity` holders, the rest wait in FIFO order."""

from __future__ import annotations

import anyio
import pytest

from computer_service.gate import TurnGate

pytestmark = pytest.mark.anyio


async def test_fifo_order_and_cap() -> None:
    gate = TurnGate(2)
    order: list[int] = []
    release = anyio.Event()
    holding = 0
    peak = 0

    async def turn(n: int) -> None:
        nonlocal holding, peak
        async with gate.slot():
            holding += 1
            peak = max(peak, holding)
            order.append(n)
            await release.wait()
            holding -= 1

    async with anyio.create_task_group() as tg:
        for n in range(6):
            tg.start_soon(turn, n)
            await anyio.sleep(0)  # queue them in a known order
        await anyio.wait_all_tasks_blocked()
        assert gate.running == 2 and gate.queued == 4
        release.set()
    assert order == list(range(6))
    assert peak == 2 and gate.peak == 2
    assert gate.running == 0 and gate.queued == 0


async def test_cancelled_waiter_leaves_the_line() -> None:
    gate = TurnGate(1)
    release = anyio.Event()
    got: list[str] = []

    async def holder() -> None:
        async with gate.slot():
            await release.wait()

    async def waiter(name: str) -> None:
        async with gate.slot():
            got.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await anyio.wait_all_tasks_blocked()
        with anyio.CancelScope() as scope:
            scope.cancel()
            await waiter("cancelled")
        tg.start_soon(waiter, "second")
        await anyio.wait_all_tasks_blocked()
        assert gate.queued == 1
        release.set()
    assert got == ["second"]
    assert gate.running == 0


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        TurnGate(0)


async def test_an_aborted_waiter_leaves_the_line_at_once_without_a_slot() -> None:
    gate = TurnGate(1)
    release = anyio.Event()
    abort = anyio.Event()
    got: list[tuple[str, bool]] = []

    async def holder() -> None:
        async with gate.slot():
            await release.wait()

    async def waiter(name: str, stop: anyio.Event | None) -> None:
        async with gate.slot(abort=stop) as held:
            got.append((name, held))

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(waiter, "aborted", abort)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(waiter, "next", None)
        await anyio.wait_all_tasks_blocked()
        assert gate.queued == 2
        abort.set()
        await anyio.wait_all_tasks_blocked()
        # Out of the line while the slot is still taken; the holder keeps it.
        assert got == [("aborted", False)]
        assert gate.queued == 1 and gate.running == 1
        release.set()
    assert got == [("aborted", False), ("next", True)]
    assert gate.running == 0 and gate.queued == 0
    # Already aborted and no free slot: no wait at all.
    async with gate.slot() as first:
        assert first
        async with gate.slot(abort=abort) as second:
            assert not second
        assert gate.running == 1
