"""Runs through a real launcher process and real bwrap, in both Linux modes."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from crew_harness.waiting import wait_until
from tests.launcher.helpers import (
    CrewLayout,
    LauncherProcess,
    engine_lines,
    processes_with,
)


def _marker() -> str:
    return f"{300 + random.random():.6f}"


def _wait_gone(marker: str, seconds: float = 3.0) -> list[int]:
    """Wait until no process carries `marker`; the ones left (none) for the callers' asserts."""
    wait_until(f"the processes marked {marker} to end", lambda: not processes_with(marker), seconds)
    return processes_with(marker)


class StreamReader:
    """Reads a run's frames on a thread so the test can act while it runs."""

    def __init__(self, launcher: LauncherProcess, body: dict[str, Any]) -> None:
        self.frames: list[dict[str, Any]] = []
        self.status: int | None = None
        self.first_line = threading.Event()
        self.done = threading.Event()
        self.ended_at = 0.0
        self._client = launcher.client()
        self._body = body
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            with self._client.stream("POST", "/runs", json=self._body) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if line:
                        self.frames.append(orjson.loads(line))
                        if self.frames[-1]["t"] == "line":
                            self.first_line.set()
        except httpx.HTTPError:
            pass  # the test closed the connection on purpose
        finally:
            self.ended_at = time.monotonic()
            self.done.set()
            self.first_line.set()

    def close(self) -> None:
        self._client.close()

    def join(self, timeout: float) -> None:
        assert self.done.wait(timeout), "the run's stream did not end"
        self._client.close()


@pytest.mark.timeout(60)
def test_run_gets_the_built_argv_exact_env_and_frames(
    launcher: LauncherProcess, layout: CrewLayout
) -> None:
    layout.add_agent("alice")
    body = layout.run_request(
        "alice",
        {"scenario": "echo", "exit": 3, "stderr_bytes": 70_000},
        session_id="ses_abc123",
        engine_args={"title": "Alice turn"},
    )
    frames = launcher.run(body)
    assert frames[0]["t"] == "started" and frames[0]["pid"] > 0
    seen = engine_lines(frames)[0]
    work = str(layout.agent_dir("alice") / "work")
    assert seen["argv"] == [
        "run", "--pure", "--format", "json", "--print-logs", "--auto",
        "--title", "Alice turn", "--dir", work,
        "--session", "ses_abc123", "--model", "local/scripted",
    ]  # fmt: skip
    tmp = str(layout.runtime_dir("alice") / "tmp")
    # SHELL: the launcher's tool shell (sandbox_launcher.tool_shell), per mode.
    shell = seen["env"].get("SHELL", "")
    assert shell.startswith(f"{layout.crew_home}/tool-shell/") and shell.endswith("/bash")
    expected = {**body["env"], "TMPPREFIX": f"{tmp}/zsh", "PWD": work, "SHELL": shell}
    # The engine's own git and rg first on its PATH (`tool_shell.engine_bin_dir`).
    engine_bin = f"{Path(shell).parent}/crew-engine-bin"
    expected["PATH"] = f"{engine_bin}:{body['env']['PATH']}"
    assert seen["env"] == expected
    assert seen["cwd"] == work
    assert frames[-2] == {"t": "line", "data": "no newline at the end"}
    exit_frame = frames[-1]
    assert exit_frame["t"] == "exit" and exit_frame["code"] == 3
    assert exit_frame["signal"] is None and exit_frame["reason"] is None
    assert exit_frame["stderr_tail"] == "e" * 65_536  # only the last 64 KiB


@pytest.mark.timeout(60)
def test_stop_sends_sigint_and_leaves_nothing(
    launcher: LauncherProcess, layout: CrewLayout
) -> None:
    layout.add_agent("alice")
    marker = _marker()
    body = layout.run_request("alice", {"scenario": "stop", "marker": marker})
    reader = StreamReader(launcher, body)
    assert reader.first_line.wait(20)
    with launcher.client() as client:
        runs = client.get("/runs").json()["runs"]
        assert [(r["run_id"], r["agent_id"]) for r in runs] == [(body["run_id"], "alice")]
        assert runs[0]["pid"] == reader.frames[0]["pid"] and runs[0]["bytes_out"] > 0
        busy = client.post("/runs", json=layout.run_request("alice", {"scenario": "echo"}))
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "agent_busy"
        asked = time.monotonic()
        stopped = client.post(f"/runs/{body['run_id']}/stop")
        assert stopped.json() == {"run_id": body["run_id"], "stopping": True}
        reader.join(10)
        assert reader.ended_at - asked < 2.5
        assert {"event": "graceful"} in engine_lines(reader.frames)
        exit_frame = reader.frames[-1]
        assert exit_frame["t"] == "exit" and exit_frame["reason"] == "stopped"
        assert exit_frame["code"] == 130  # the engine's own SIGINT exit, passed on by bwrap
        assert client.get("/runs").json() == {"runs": []}
        assert client.post(f"/runs/{body['run_id']}/stop").status_code == 404
    assert _wait_gone(marker) == []


@pytest.mark.timeout(60)
def test_stop_kills_an_engine_that_ignores_sigint(
    launcher: LauncherProcess, layout: CrewLayout
) -> None:
    layout.add_agent("alice")
    reader = StreamReader(launcher, layout.run_request("alice", {"scenario": "ignore_int"}))
    assert reader.first_line.wait(20)
    with launcher.client() as client:
        asked = time.monotonic()
        client.post(f"/runs/{reader._body['run_id']}/stop")
    reader.join(10)
    took = reader.ended_at - asked
    assert 1.9 < took < 3.5, took  # the 2 s grace, then SIGKILL
    exit_frame = reader.frames[-1]
    assert exit_frame["reason"] == "stopped" and exit_frame["signal"] == 9


@pytest.mark.timeout(60)
def test_output_over_the_cap_kills_the_run(launcher: LauncherProcess, layout: CrewLayout) -> None:
    layout.add_agent("alice")
    script = {"scenario": "flood", "line_size": 1000, "lines": 1000, "then_sleep": 30}
    frames = launcher.run(layout.run_request("alice", script, stdout_limit=100_500))
    lines = [f for f in frames if f["t"] == "line"]
    assert len(lines) == 100  # every complete line within the cap, nothing after it
    assert all(f["data"] == "x" * 999 for f in lines)
    assert frames[-1]["reason"] == "output_too_large"


@pytest.mark.timeout(60)
def test_a_line_far_over_64_kib_arrives_whole(
    launcher: LauncherProcess, layout: CrewLayout
) -> None:
    layout.add_agent("alice")
    script = {"scenario": "flood", "line_size": 3 * 1024 * 1024, "lines": 1}
    frames = launcher.run(layout.run_request("alice", script))
    lines = [f for f in frames if f["t"] == "line"]
    assert [len(f["data"]) for f in lines] == [3 * 1024 * 1024 - 1]
    assert frames[-1]["code"] == 0 and frames[-1]["reason"] is None


@pytest.mark.timeout(60)
def test_a_background_child_holding_the_pipe_does_not_hang_the_run(
    launcher: LauncherProcess, layout: CrewLayout
) -> None:
    layout.add_agent("alice")
    marker = _marker()
    started = time.monotonic()
    frames = launcher.run(
        layout.run_request("alice", {"scenario": "pipe_holder", "marker": marker})
    )
    assert time.monotonic() - started < 5
    assert frames[-1]["t"] == "exit" and frames[-1]["code"] == 0
    assert _wait_gone(marker) == []


@pytest.mark.timeout(60)
def test_a_client_that_disconnects_stops_its_run(
    launcher: LauncherProcess, layout: CrewLayout
) -> None:
    layout.add_agent("alice")
    marker = _marker()
    body = orjson.dumps(layout.run_request("alice", {"scenario": "stop", "marker": marker}))
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(str(launcher.socket))
    head = (
        "POST /runs HTTP/1.1\r\nHost: launcher\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {launcher.secret}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    raw.sendall(head.encode() + body)
    received = b""
    while b"waiting" not in received:
        chunk = raw.recv(65536)
        assert chunk, received
        received += chunk
    raw.close()  # the client goes away mid-run
    with launcher.client() as client:
        wait_until("no runs", lambda: client.get("/runs").json() == {"runs": []}, 5)
    assert _wait_gone(marker) == []


@pytest.mark.timeout(60)
def test_models_keeps_only_provider_model_lines(launcher: LauncherProcess) -> None:
    with launcher.client() as client:
        answer = client.post("/models", json={})
        health = client.get("/health").json()
    assert answer.json() == {"models": ["local/scripted", "opencode/big-pickle"]}
    assert health["engine"]["version"] == "0.0.0-fake"
    assert health["sandbox"]["mode"] in ("hybrid", "tmpfs")


@pytest.mark.timeout(60)
def test_wrong_or_missing_secret_is_refused(launcher: LauncherProcess) -> None:
    with launcher.client(secret="not-the-secret-at-all") as client:
        wrong = client.get("/health")
    with httpx.Client(
        transport=httpx.HTTPTransport(uds=str(launcher.socket)), base_url="http://launcher"
    ) as client:
        missing = client.get("/runs")
    for answer in (wrong, missing):
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "unauthorized"


@pytest.mark.timeout(60)
def test_launcher_socket_is_private_and_gone_after_stdin_closes(
    launcher: LauncherProcess,
) -> None:
    assert os.stat(launcher.socket).st_mode & 0o777 == 0o600
    assert os.stat(launcher.socket.parent).st_mode & 0o777 == 0o700
    code, err = launcher.stop()
    assert code == 0, err
    assert not launcher.socket.exists()


@pytest.mark.timeout(30)
def test_launcher_without_a_secret_on_stdin_refuses_to_start(layout: CrewLayout) -> None:
    argv = [sys.executable, "-I", "-m", "sandbox_launcher", "serve"]
    argv += ["--crew-home", str(layout.crew_home), "--run-id", layout.run_id]
    argv += ["--socket", str(layout.crew_home / "sockets" / "x.sock")]
    done = subprocess.run(argv, input=b"", capture_output=True, timeout=20, check=False)
    assert done.returncode == 2
    assert b"bearer secret" in done.stderr
    assert done.stdout == b""


@pytest.mark.timeout(60)
def test_sandbox_command_runs_under_the_agent_policy(
    needs_bwrap: None, layout: CrewLayout, isolated_home: Path
) -> None:
    layout.add_agent("alice")
    (isolated_home / "secret").write_text("TOP-SECRET\n")
    agent, runtime = layout.agent_dir("alice"), layout.runtime_dir("alice")
    script = (
        'cat "$1/secret"; echo rc=$?; echo hi > "$2/ok" && echo wrote; '
        'echo x > "$1/.bashrc"; echo home_rc=$?; exit 7'
    )
    for mode in ("hybrid", "tmpfs"):
        argv = [sys.executable, "-m", "sandbox_launcher", "sandbox", "--mode", mode]
        argv += ["--agent-dir", str(agent), "--runtime-dir", str(runtime), "--"]
        argv += ["/bin/sh", "-c", script, "sh", str(isolated_home), str(agent)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 7, done.stderr
        assert "TOP-SECRET" not in done.stdout
        assert "rc=1" in done.stdout and "wrote" in done.stdout and "home_rc=" in done.stdout
        assert "home_rc=0" not in done.stdout
        assert (agent / "ok").read_text() == "hi\n"
        assert not (isolated_home / ".bashrc").exists()


PARENT = """
import subprocess, sys, time
argv = sys.argv[2:]
launcher = subprocess.Popen(argv, stdin=int(sys.argv[1]), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
print(launcher.pid, flush=True)
print(launcher.stdout.readline().decode().strip(), flush=True)
time.sleep(600)
"""


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except FileNotFoundError:
        return True


@pytest.mark.timeout(60)
def test_launcher_dies_with_its_parent(needs_bwrap: None, layout: CrewLayout) -> None:
    # stdin stays open (we hold the pipe): only the parent-death signal can end it.
    read_end, write_end = os.pipe()
    sock = layout.crew_home / "sockets" / "launcher-orphan.sock"
    argv = [sys.executable, "-I", "-m", "sandbox_launcher", "serve", "--crew-home"]
    argv += [str(layout.crew_home), "--run-id", layout.run_id, "--socket", str(sock)]
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(read_end), *argv],
        pass_fds=(read_end,),
        stdout=subprocess.PIPE,
    )
    try:
        os.write(write_end, b"a-secret-long-enough-1234\n")
        assert parent.stdout is not None
        launcher_pid = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == b"ready"
        assert not _dead(launcher_pid)
        parent.kill()
        parent.wait()
        wait_until("the launcher to die with the Computer", lambda: _dead(launcher_pid), 15)
        assert not sock.exists(), "the launcher did not remove its socket"
    finally:
        os.close(read_end)
        os.close(write_end)
        if parent.poll() is None:
            parent.kill()


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


@pytest.mark.timeout(60)
def test_an_idle_launcher_sleeps_and_keeps_no_zombies(launcher: LauncherProcess) -> None:
    # The self-test's sandbox leaves bwrap's pid 1 to the launcher (a subreaper): reaped.
    children = [
        int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == launcher.pid
    ]
    assert [c for c in children if _status(c)["State"].startswith("Z")] == []
    # uvicorn's own main loop wakes every 100 ms; the launcher's waits for its stop.
    before = int(_status(launcher.pid)["voluntary_ctxt_switches"])
    time.sleep(1.0)
    woke = int(_status(launcher.pid)["voluntary_ctxt_switches"]) - before
    assert woke < 5


def _ppid(pid: int) -> int | None:
    try:
        return int(_status(pid)["PPid"])
    except (OSError, KeyError):
        return None
