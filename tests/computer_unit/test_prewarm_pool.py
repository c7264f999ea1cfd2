"""The pool's prewarm (issue 26): a server started ahead of a turn, only when it fits the
budget as it is, the first evicted while no turn used it, and the turn that finds it
warm (or still starting: it waits for that start instead of a second one)."""

from __future__ import annotations

import anyio
import pytest

from computer_service.engine.warm_pool import WarmPool
from crew_common.launcher_wire import ServerInfo, ServerRequest
from tests.computer_unit.test_warm_parts import ENV, MB, Clock, FakeLauncher, request_for

pytestmark = pytest.mark.anyio


def found(pool: WarmPool) -> dict[str, int]:
    c = pool.counters
    return {
        "warm": c.turns_found_warm,
        "starting": c.turns_found_starting,
        "none": c.turns_found_none,
    }


async def test_a_prewarmed_server_is_the_one_the_next_turn_finds_warm() -> None:
    launcher = FakeLauncher()
    pool = WarmPool(launcher, memory_budget=4096 * MB, clock=Clock())
    assert await pool.prewarm("a", ENV, request_for("a")) == "started"
    assert launcher.started == ["a"] and pool.servers["a"].unused_prewarm
    assert await pool.prewarm("a", ENV, request_for("a")) == "warm"  # a second hint: nothing
    server = await pool.acquire("a", ENV, request_for("a"))
    assert server is not None and launcher.started == ["a"]  # no second start
    assert await pool.prewarm("a", ENV, request_for("a")) == "busy"
    await pool.release(server)
    assert not server.unused_prewarm
    assert found(pool) == {"warm": 1, "starting": 0, "none": 0}
    assert pool.counters.prewarms == 1
    lines = pool.counters.lines()
    assert "crew_prewarm_starts_total 1" in lines
    assert 'crew_warm_turn_server_total{found="warm"} 1' in lines
    await pool.close()


async def test_a_turn_without_a_prewarm_counts_as_finding_none() -> None:
    pool = WarmPool(FakeLauncher(), memory_budget=4096 * MB, clock=Clock())
    server = await pool.acquire("a", ENV, request_for("a"))
    assert server is not None
    await pool.release(server)
    again = await pool.acquire("a", ENV, request_for("a"))
    assert again is server
    await pool.release(again)
    assert found(pool) == {"warm": 1, "starting": 0, "none": 1}
    await pool.close()


async def test_a_prewarm_with_another_environment_restarts_the_idle_server() -> None:
    launcher = FakeLauncher()
    pool = WarmPool(launcher, memory_budget=4096 * MB, clock=Clock())
    server = await pool.acquire("a", ENV, request_for("a"))
    assert server is not None
    await pool.release(server)
    other = {**ENV, "OPENCODE_CONFIG_CONTENT": '{"model":"b"}'}
    assert await pool.prewarm("a", other, request_for("a")) == "started"
    assert launcher.stopped == ["a"] and launcher.started == ["a", "a"]
    await pool.close()


async def test_a_prewarm_never_evicts_and_is_skipped_over_the_budget() -> None:
    launcher = FakeLauncher(rss=600 * MB)
    clock = Clock()
    pool = WarmPool(launcher, memory_budget=1400 * MB, server_estimate=650 * MB, clock=clock)
    a = await pool.acquire("a", ENV, request_for("a"))
    assert a is not None
    await pool.release(a)
    assert await pool.prewarm("b", ENV, request_for("b")) == "started"  # 600 + 650 fits
    assert await pool.prewarm("c", ENV, request_for("c")) == "budget"  # it would evict
    assert launcher.started == ["a", "b"] and launcher.stopped == []
    assert pool.counters.prewarm_skipped_budget == 1
    assert "crew_prewarm_skipped_budget_total 1" in pool.counters.lines()
    await pool.close()


async def test_an_unused_prewarm_is_evicted_before_a_server_turns_used() -> None:
    launcher = FakeLauncher(rss=600 * MB)
    clock = Clock()
    pool = WarmPool(launcher, memory_budget=1400 * MB, server_estimate=650 * MB, clock=clock)
    clock.now = 1
    assert await pool.prewarm("p", ENV, request_for("p")) == "started"  # older
    clock.now = 2
    a = await pool.acquire("a", ENV, request_for("a"))
    assert a is not None
    clock.now = 3
    await pool.release(a)  # used, and more recent than the prewarm...
    clock.now = 0  # ...even were it older, the unused prewarm goes first
    a.last_used = 0
    c = await pool.acquire("c", ENV, request_for("c"))
    assert c is not None and launcher.stopped == ["p"] and "a" in pool.servers
    await pool.close()


class SlowLauncher(FakeLauncher):
    """A start that waits until the test lets it finish."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = anyio.Event()
        self.go = anyio.Event()

    async def start_server(self, request: ServerRequest) -> ServerInfo:
        self.entered.set()
        await self.go.wait()
        return await super().start_server(request)


async def test_a_turn_during_its_prewarm_waits_for_that_start_not_a_second_one() -> None:
    launcher = SlowLauncher()
    pool = WarmPool(launcher, memory_budget=4096 * MB, clock=Clock())
    outcomes: list[str] = []
    got = []

    async def prewarm() -> None:
        outcomes.append(await pool.prewarm("a", ENV, request_for("a")))

    async def turn() -> None:
        got.append(await pool.acquire("a", ENV, request_for("a")))

    async with anyio.create_task_group() as tg:
        tg.start_soon(prewarm)
        await launcher.entered.wait()
        assert await pool.prewarm("a", ENV, request_for("a")) == "starting"
        tg.start_soon(turn)
        await anyio.wait_all_tasks_blocked()
        assert got == []  # the turn waits for the start under way
        launcher.go.set()
    assert outcomes == ["started"] and launcher.started == ["a"]
    [server] = got
    assert server is pool.servers["a"] and server.busy
    assert found(pool) == {"warm": 0, "starting": 1, "none": 0}
    await pool.release(server)
    await pool.close()


async def test_no_prewarm_for_a_cold_agent_or_a_closed_pool() -> None:
    pool = WarmPool(FakeLauncher(), memory_budget=4096 * MB, clock=Clock())
    pool.cold_agents["a"] = "three failed starts"
    assert await pool.prewarm("a", ENV, request_for("a")) == "cold"
    await pool.close()
    assert await pool.prewarm("b", ENV, request_for("b")) == "cold"
