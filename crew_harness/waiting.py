"""Wait until something happened: poll a probe until it answers, fail saying what was awaited.

A test waits on the thing itself (a counter, a row, a log line, a file), never on
a fixed `sleep`. The timeout only bounds a test that would otherwise hang; it is
generous, not a measurement.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import anyio

T = TypeVar("T")

SYNC_INTERVAL_S = 0.05
ASYNC_INTERVAL_S = 0.02


class WaitTimeout(AssertionError):
    """What was awaited did not happen in time (an AssertionError: the test fails, not errors)."""


def wait_until(what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
    """Call `probe` until it returns something truthy and return that; fail saying `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(SYNC_INTERVAL_S)


@overload
async def wait_until_async(
    what: str, probe: Callable[[], Awaitable[T | None]], timeout: float = 30.0
) -> T: ...


@overload
async def wait_until_async(
    what: str, probe: Callable[[], T | None], timeout: float = 30.0
) -> T: ...


async def wait_until_async(what: str, probe: Callable[[], Any], timeout: float = 30.0) -> Any:
    """`wait_until` for async tests: `probe` may be sync or async; other tasks run meanwhile."""
    with anyio.move_on_after(timeout):
        while True:
            value = probe()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await anyio.sleep(ASYNC_INTERVAL_S)
    raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}")
