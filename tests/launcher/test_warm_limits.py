"""A warm server's caps: the launcher watches its cgroup, kills it at the first hit, and says which.

A real process stands in for the server and a directory of counter files for
its cgroup (the files `RunCgroup.hit` reads), so no root and no OpenCode are
needed; `tests/e2e/test_warm_limits.py` has the real cgroup, fork bomb and
OOM kill.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandbox_launcher.limits import ResourceWatch, RunCgroup, TurnLimits
from sandbox_launcher.warm_server import WarmServer
from tests.launcher.helpers import CrewLayout
from tests.launcher.inprocess import SECRET, inprocess_app, inprocess_launcher


def counters(tmp_path: Path, *, oom_kill: int = 0, forks_refused: int = 0) -> RunCgroup:
    """A v1-shaped cgroup of counter files only (never created or removed through the kernel)."""
    (tmp_path / "memory.oom_control").write_text(f"oom_kill_disable 0\noom_kill {oom_kill}\n")
    (tmp_path / "pids.events").write_text(f"max {forks_refused}\n")
    return RunCgroup(1, tmp_path, tmp_path)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[WarmServer]:
    """A "server" (`sleep`, in its own group as a real one) watched through `counters`."""
    started = WarmServer("alice", ["sleep", "600"], {})
    started.process = subprocess.Popen(["sleep", "600"], start_new_session=True)
    # `cgroup` stays None: `stop` must not remove the counter directory.
    started._watch = ResourceWatch(TurnLimits(), counters(tmp_path), started.process.pid)
    try:
        yield started
    finally:
        started.stop()


def test_no_hit_leaves_the_server_running(server: WarmServer) -> None:
    assert server.check_limits() is None
    assert server.alive()


def test_the_first_hit_kills_the_server_and_is_kept(server: WarmServer, tmp_path: Path) -> None:
    counters(tmp_path, forks_refused=3)
    assert server.check_limits() == "process_limit"
    assert server.process is not None and server.process.wait(30) == -9
    counters(tmp_path, oom_kill=1)  # what came later does not replace the first
    assert server.check_limits() == "process_limit"


def test_the_watch_thread_ends_the_server_at_a_hit(server: WarmServer, tmp_path: Path) -> None:
    watch = threading.Thread(target=server._watch_limits, daemon=True)
    watch.start()
    counters(tmp_path, oom_kill=1)
    watch.join(30)
    assert not watch.is_alive()
    assert server.limit_hit == "memory_limit"
    assert server.process is not None and server.process.wait(30) == -9


@pytest.mark.anyio
async def test_the_limit_route_answers_the_hit_and_404_without_a_server(
    layout: CrewLayout, fake_opencode: Path, server: WarmServer, tmp_path: Path
) -> None:
    launcher = inprocess_launcher(layout, fake_opencode)
    transport = httpx.ASGITransport(app=inprocess_app(launcher))
    headers = {"Authorization": f"Bearer {SECRET}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://l", headers=headers) as c:
        gone = await c.get("/servers/alice/limit")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "unknown_server"
        launcher.servers.claim(server)
        clean = await c.get("/servers/alice/limit")
        assert clean.json() == {"agent_id": "alice", "limit_hit": None}
        counters(tmp_path, oom_kill=2)
        # The server is dead by now; it is still there to be asked about.
        for _ in range(2):
            hit = await c.get("/servers/alice/limit")
            assert hit.json() == {"agent_id": "alice", "limit_hit": "memory_limit"}
