"""`crew-server` as a process: the user token is printed once; --dev only on loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from crew_server.__main__ import is_loopback
from crew_testkit.crew_server_proc import computer_connection, free_port
from crew_testkit.waiting import wait_until


def run_until_healthy(db: Path, *extra: str) -> tuple[str, str]:
    """Start crew-server, wait for /health, stop it; return (stdout, url)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "crew_server", "--db", str(db), "--port", str(port), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )

    def healthy() -> bool:
        assert process.poll() is None, process.communicate()[0].decode()
        try:
            return httpx.get(f"{url}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until("crew-server to answer /health", healthy, 20)
        if not extra:
            # not --dev: the user API wants the token
            assert httpx.get(f"{url}/api/agents", timeout=5).status_code == 401
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=10)
    return out.decode(), url


@pytest.mark.timeout(60)
def test_user_token_is_printed_once_at_first_start(tmp_path: Path) -> None:
    db = tmp_path / "crew.db"
    first, _ = run_until_healthy(db)
    lines = [line for line in first.splitlines() if line.startswith("user token")]
    assert len(lines) == 1 and "cru_" in lines[0]
    second, _ = run_until_healthy(db)
    assert "user token" not in second
    dev, _ = run_until_healthy(tmp_path / "dev.db", "--dev")
    assert "user token" not in dev


@pytest.mark.timeout(30)
def test_dev_is_refused_off_loopback(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "crew_server",
            "--db",
            str(tmp_path / "x.db"),
            "--host",
            "0.0.0.0",
            "--port",
            str(free_port()),
            "--dev",
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 2
    assert "--dev" in done.stderr and "loopback" in done.stderr
    assert not (tmp_path / "x.db").exists()


@pytest.mark.timeout(60)
def test_sigterm_ends_open_event_streams_and_exits_0(tmp_path: Path) -> None:
    import threading

    from crew_testkit.crew_server_proc import start_crew_server

    server = start_crew_server(tmp_path)
    computer = server.create_computer()
    ended = threading.Event()
    outcome: list[str] = []
    opened = threading.Event()

    def listen() -> None:
        try:
            headers = computer_connection(server.client(), computer["token"])
            with httpx.stream(
                "GET", f"{server.url}/computer/events", headers=headers, timeout=30
            ) as stream:
                for line in stream.iter_lines():
                    if line == ": connected":
                        opened.set()
            outcome.append("closed by the server")
        except httpx.HTTPError as exc:
            outcome.append(f"cut: {exc!r}")
        ended.set()

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert opened.wait(10)
    server.process.terminate()
    assert server.process.wait(timeout=10) == 0
    assert ended.wait(5)
    # The server ended the stream itself (a complete chunked answer), instead of
    # uvicorn cutting it when its 3 s shutdown grace ran out.
    assert outcome == ["closed by the server"]
    server.stop()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("crew.example.com", False),
        ("", False),
    ],
)
def test_dev_mode_is_allowed_only_on_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
