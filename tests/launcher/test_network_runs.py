"""Runs of the real launcher (`POST /runs`) in their own network: a published port, nothing left after.

The launcher owns pasta: it starts with the run, listens for `publish_port`
on the host's loopback only, and is gone once the run ends, stopped or not.
"""

from __future__ import annotations

import socket
from pathlib import Path

import orjson
import pytest

from crew_harness.waiting import wait_until
from sandbox_launcher.network import find_pasta
from tests.launcher.helpers import LauncherProcess, children_of, make_layout, write_fake_opencode
from tests.support.ci import required_in_ci

INSIDE_PORT = 4096


def _pastas(parent: int) -> list[int]:
    """Live pasta processes whose parent is `parent` (the launcher)."""
    return [pid for pid, comm in children_of(parent) if comm.startswith("pas")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["hybrid", "tmpfs"])
def test_a_published_port_reaches_the_sandbox_and_pasta_ends_with_the_stop(
    mode: str, needs_bwrap: None, isolated_home: Path, tmp_path: Path
) -> None:
    if find_pasta() is None:
        required_in_ci("pasta (Debian package passt)")
    layout = make_layout(isolated_home)
    layout.add_agent("alice")
    launcher = LauncherProcess(layout, write_fake_opencode(tmp_path / "bin"), mode=mode)
    try:
        body = layout.run_request(
            "alice", {"scenario": "serve", "port": INSIDE_PORT}, publish_port=INSIDE_PORT
        )
        with launcher.client() as client, client.stream("POST", "/runs", json=body) as response:
            assert response.status_code == 200, response.read()
            lines = response.iter_lines()
            started = orjson.loads(next(lines))
            assert started["t"] == "started" and started["published_port"], started
            port = started["published_port"]
            assert orjson.loads(orjson.loads(next(lines))["data"]) == {"event": "listening"}
            pastas = _pastas(launcher.pid)
            assert pastas, "no pasta next to the run"
            # Only on the host's loopback: the host's other addresses have nothing there.
            with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                assert c.recv(100) == b"hello from the sandbox"
            assert orjson.loads(orjson.loads(next(lines))["data"]) == {"event": "served"}
            stopped = client.post(f"/runs/{body['run_id']}/stop")
            assert stopped.status_code == 200, stopped.text
            frames = [orjson.loads(line) for line in lines if line]
        assert frames[-1]["t"] == "exit", frames
        wait_until("pasta gone", lambda: not _pastas(launcher.pid))
        assert all(not Path(f"/proc/{p}").exists() for p in pastas)
        # The port is closed again: pasta listened there, nobody else does.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=10)
    finally:
        code, err = launcher.stop()
    assert code == 0, err


@pytest.mark.timeout(120)
def test_pasta_dies_with_a_killed_launcher(
    needs_bwrap: None, isolated_home: Path, tmp_path: Path
) -> None:
    """SIGKILL leaves the launcher no clean-up: the parent-death signal ends pasta anyway."""
    if find_pasta() is None:
        required_in_ci("pasta (Debian package passt)")
    layout = make_layout(isolated_home)
    layout.add_agent("alice")
    launcher = LauncherProcess(layout, write_fake_opencode(tmp_path / "bin"))
    try:
        body = layout.run_request("alice", {"scenario": "serve", "port": INSIDE_PORT})
        with launcher.client() as client, client.stream("POST", "/runs", json=body) as response:
            lines = response.iter_lines()
            assert orjson.loads(next(lines))["t"] == "started"
            assert orjson.loads(orjson.loads(next(lines))["data"]) == {"event": "listening"}
            pastas = _pastas(launcher.pid)
            assert pastas, "no pasta next to the run"
            launcher.proc.kill()
            launcher.proc.wait()
        wait_until("pasta gone", lambda: all(not _alive(p) for p in pastas))
    finally:
        launcher.stop()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
