"""EngineRun on plain processes (no sandbox): framing, exit status, stdin, the pipe-holder rule."""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

import orjson
import pytest

from crew_harness.waiting import wait_until
from sandbox_launcher.engine_run import DRAIN_GRACE_S, EngineRun
from tests.launcher.helpers import processes_with


async def run(script: str, stdin: bytes = b"", limit: int = 1 << 20) -> list[dict[str, Any]]:
    sent: list[bytes] = []

    async def emit(data: bytes) -> None:
        sent.append(data)

    engine = EngineRun(
        "r1", "a1", ["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin"}, stdin, limit
    )
    exit_frame = await engine.execute(emit)
    frames = [orjson.loads(line) for line in b"".join(sent).splitlines()]
    return [*frames, exit_frame.model_dump()]


@pytest.mark.anyio
async def test_lines_are_framed_exactly() -> None:
    frames = await run(r"printf 'a\377b\n\nc\r\nlast'; exit 4")
    assert frames[0]["t"] == "started"
    assert [f["data"] for f in frames if f["t"] == "line"] == ["a\ufffdb", "", "c\r", "last"]
    assert frames[-1] == {"t": "exit", "code": 4, "signal": None, "stderr_tail": "", "reason": None}


@pytest.mark.anyio
async def test_stdin_is_written_then_closed() -> None:
    frames = await run("cat; echo done", stdin=b"turn input\n" * 3)
    assert [f["data"] for f in frames if f["t"] == "line"] == ["turn input"] * 3 + ["done"]


@pytest.mark.anyio
async def test_death_by_signal_is_reported_as_signal() -> None:
    frames = await run("echo x >&2; kill -TERM $$")
    assert frames[-1]["signal"] == signal.SIGTERM and frames[-1]["code"] is None
    assert frames[-1]["stderr_tail"] == "x\n"


@pytest.mark.anyio
async def test_a_daemon_outside_the_group_cannot_hold_the_run_open() -> None:
    # Without a pid namespace a setsid'd child escapes the group and keeps
    # stdout open: the run still ends shortly after its leader.
    marker = f"{300 + random.random():.6f}"
    started = time.monotonic()
    try:
        frames = await run(f"setsid sleep {marker} & echo hi")
        assert time.monotonic() - started < DRAIN_GRACE_S + 1.5
        assert [f["data"] for f in frames if f["t"] == "line"] == ["hi"]
        assert frames[-1]["code"] == 0
    finally:
        for pid in processes_with(marker):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.anyio
async def test_group_members_get_sigterm_after_the_leader_exits() -> None:
    marker = f"{300 + random.random():.6f}"
    await run(f"sleep {marker} & echo started")
    wait_until("the group's members to end", lambda: not processes_with(marker), 3)
