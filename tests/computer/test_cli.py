"""`crew-computer` as a person or a service manager runs it: the real console script.

In a terminal (a pty on stdin) it answers `--help` at once, says what it waits
for, and Ctrl+C ends it with one line; the bootstrap can be a regular file on
stdin (systemd's `StandardInput=file:`) or `run --config FILE`; SIGTERM stops it.
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import orjson
import pytest

from crew_harness.waiting import wait_until
from crew_testkit.computer_proc import (
    READY_TIMEOUT_S,
    ComputerProc,
    Machine,
    bootstrap_for,
    launch,
    machine,
)

pytestmark = pytest.mark.timeout(120)

SECRET = "computer-token-that-must-not-leak-4711"


def crew_computer() -> str:
    path = Path(sys.executable).parent / "crew-computer"
    assert path.exists(), f"{path} is missing: run scripts/setup"
    return str(path)


def read_line(stream: IO[bytes], timeout: float = READY_TIMEOUT_S) -> bytes:
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else b""


@contextlib.contextmanager
def terminal() -> Iterator[int]:
    """The child side of a pseudo-terminal, for a child's stdin."""
    parent, child = pty.openpty()
    try:
        yield child
    finally:
        os.close(child)
        os.close(parent)


def start(
    m: Machine, argv: list[str], stdin: Any, env: dict[str, str] | None = None
) -> ComputerProc:
    """Start the console script and wait for `ready` on its stdout."""
    stderr_path = m.root / "computer.log"
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(
            [crew_computer(), *argv],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env or m.env(),
            cwd=m.root,
        )
    computer = ComputerProc(proc, m.crew_home, stderr_path)
    assert proc.stdout is not None
    got = read_line(proc.stdout)
    if got != b"ready\n":
        computer.stop("SIGTERM", timeout=10)
        raise AssertionError(f"no ready (got {got!r}): {computer.stderr()[-3000:]}")
    return computer


def keeps_running_until(c: ComputerProc, how: str) -> None:
    """Connected and serving its socket; then `how` (a signal) stops it in order."""
    wait_until("/health saying connected", lambda: _connected(c))
    assert c.proc.poll() is None
    assert c.stop(how) == 0, c.stderr()[-3000:]
    assert not c.socket.exists()


def _connected(c: ComputerProc) -> bool:
    try:
        return bool(c.get("/health")["connected"])
    except httpx.TransportError:  # the socket is not open yet
        return False


def test_help_in_a_terminal_answers_at_once() -> None:
    with terminal() as tty:
        done = subprocess.run(
            [crew_computer(), "--help"], stdin=tty, capture_output=True, text=True, timeout=30
        )
    assert done.returncode == 0, done.stderr
    assert "run --config" in done.stdout
    assert "CREW_LOG_LEVEL" in done.stdout and "CREW_COMPUTER_TOKEN" in done.stdout


def test_ctrl_c_while_waiting_for_the_bootstrap_exits_130_with_one_line() -> None:
    with machine() as m, terminal() as tty:
        proc = subprocess.Popen(
            [crew_computer()],
            stdin=tty,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=m.env(),
        )
        assert proc.stderr is not None
        first = read_line(proc.stderr)
        assert b"waiting for the bootstrap" in first, first
        proc.send_signal(signal.SIGINT)  # what Ctrl+C sends
        out, rest = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert out == b""
    assert rest == b"crew-computer: interrupted before the Computer started\n"


def test_an_unknown_log_level_is_one_line() -> None:
    with machine() as m:
        done = subprocess.run(
            [crew_computer()],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            env=m.env() | {"CREW_LOG_LEVEL": "loud"},
        )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "CREW_LOG_LEVEL" in done.stderr, done.stderr


def test_bootstrap_in_a_regular_file_on_stdin_runs_until_sigterm(crew_server: Any) -> None:
    with machine() as m:
        comp = crew_server.create_computer()
        boot = m.root / "boot.json"
        # Pretty-printed: a whole file is one bootstrap, not only its first line.
        boot.write_bytes(
            orjson.dumps(
                bootstrap_for(crew_server.url, comp["token"], m), option=orjson.OPT_INDENT_2
            )
        )
        with boot.open("rb") as stdin:
            c = start(m, [], stdin)
        keeps_running_until(c, "SIGTERM")


def test_run_with_a_config_and_a_token_file(crew_server: Any) -> None:
    with machine() as m:
        comp = crew_server.create_computer()
        etc = m.root / "etc"
        etc.mkdir()
        token_file = etc / "token"
        token_file.write_text(comp["token"] + "\n")  # as `echo` writes it
        token_file.chmod(0o600)
        config = bootstrap_for(crew_server.url, "unused", m)
        del config["token"]
        # Relative paths are relative to the config's directory.
        config |= {"token_file": "token", "crew_home": "../crew"}
        (etc / "computer.json").write_bytes(orjson.dumps(config))
        c = start(m, ["run", "--config", str(etc / "computer.json")], subprocess.DEVNULL)
        cmdline = Path(f"/proc/{c.proc.pid}/cmdline").read_bytes()
        assert comp["token"].encode() not in cmdline
        keeps_running_until(c, "SIGTERM")


def test_run_with_the_token_in_the_environment_stops_on_ctrl_c(crew_server: Any) -> None:
    with machine() as m:
        comp = crew_server.create_computer()
        config = bootstrap_for(crew_server.url, "unused", m)
        del config["token"]
        path = m.root / "computer.json"
        path.write_bytes(orjson.dumps(config))
        env = m.env() | {"CREW_COMPUTER_TOKEN": comp["token"]}
        c = start(m, ["run", "--config", str(path)], subprocess.DEVNULL, env)
        keeps_running_until(c, "SIGINT")


@pytest.mark.parametrize(
    ("config", "token_file", "env", "expected"),
    [
        ({}, None, {}, "no token"),
        ({"token": SECRET}, None, {}, "must not hold the token"),
        ({"token_file": "missing"}, None, {}, "cannot read the token file"),
        ({"token_file": "token"}, f"{SECRET}\nsecond line\n", {}, "printable ASCII"),
        ({}, None, {"CREW_COMPUTER_TOKEN": f"{SECRET}\r"}, "control characters"),
        ({"max_concurrent_turns": 0}, None, {"CREW_COMPUTER_TOKEN": SECRET}, "max_concurrent"),
    ],
    ids=[
        "no-token",
        "token-inline",
        "token-file-missing",
        "token-two-lines",
        "env-cr",
        "bad-field",
    ],
)
def test_a_bad_config_is_one_line_without_the_token(
    config: dict[str, Any], token_file: str | None, env: dict[str, str], expected: str
) -> None:
    with machine() as m:
        path = m.root / "computer.json"
        path.write_bytes(orjson.dumps({"server_url": "http://127.0.0.1:9", **config}))
        if token_file is not None:
            (m.root / "token").write_text(token_file)
            (m.root / "token").chmod(0o600)
        done = subprocess.run(
            [crew_computer(), "run", "--config", str(path)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            env=m.env() | env,
        )
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("crew-computer: "), done.stderr
    assert expected in done.stderr and SECRET not in done.stderr


def test_a_missing_config_is_one_line() -> None:
    with machine() as m:
        done = subprocess.run(
            [crew_computer(), "run", "--config", str(m.root / "nope.json")],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            env=m.env(),
        )
    assert done.returncode == 1
    assert (
        done.stderr
        == f"crew-computer: cannot read the config {m.root}/nope.json: No such file or directory\n"
    )


def test_sockets_of_launchers_that_are_gone_are_removed_at_start(crew_server: Any) -> None:
    with machine() as m:
        comp = crew_server.create_computer()
        sockets = m.crew_home / "sockets"
        sockets.mkdir(parents=True, mode=0o700)
        dead = [sockets / f"launcher-0123456789abcdef{s}.sock" for s in ("", "-2")]
        for path in dead:
            # What a killed run leaves: bound, nobody listening any more.
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.bind(str(path))
        boot = m.root / "boot.json"
        boot.write_bytes(orjson.dumps(bootstrap_for(crew_server.url, comp["token"], m)))
        with boot.open("rb") as stdin:
            c = start(m, [], stdin)
        try:
            wait_until("the dead sockets removed", lambda: not any(p.exists() for p in dead))
        finally:
            assert c.stop("SIGTERM") == 0, c.stderr()[-3000:]
        assert "removed the socket launcher-0123456789abcdef.sock" in c.stderr()


def test_a_refused_connection_is_said_once(tmp_path: Path) -> None:
    """The reason is one line at exit, not also a log line before it (a new user saw both)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with machine() as m:
        proc = launch(m, {"server_url": f"http://127.0.0.1:{port}", "token": "t"}, wait_ready=False)
        assert proc.proc.wait(timeout=60) == 1
        stderr = proc.stderr()
    assert stderr.count("cannot connect to the crew server") == 1, stderr
    assert stderr.splitlines()[-1].startswith("crew-computer: cannot connect to the crew server")
