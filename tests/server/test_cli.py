"""`crew-server` as a process: the user token is printed once (or written to
--user-token-file) and always needed, --dev too; --dev only on loopback."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from crew_harness.ports import free_port
from crew_harness.waiting import wait_until
from crew_server.__main__ import is_loopback
from crew_testkit.crew_server_proc import computer_connection


def run_until_healthy(db: Path, *extra: str, token_file: Path | None = None) -> tuple[str, str]:
    """Start crew-server, wait for /health, check the user API wants the user token (the
    one in `token_file` when given works), stop it; return (stdout, url)."""
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
        # with --dev or without, the user API wants the token
        assert httpx.get(f"{url}/api/agents", timeout=5).status_code == 401
        if token_file is not None:
            auth = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
            assert httpx.get(f"{url}/api/agents", headers=auth, timeout=5).status_code == 200
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


@pytest.mark.timeout(60)
def test_dev_mode_prints_the_user_token_too(tmp_path: Path) -> None:
    db = tmp_path / "dev.db"
    first, _ = run_until_healthy(db, "--dev")
    lines = [line for line in first.splitlines() if line.startswith("user token")]
    assert len(lines) == 1 and "cru_" in lines[0]
    second, _ = run_until_healthy(db, "--dev")
    assert "user token" not in second


@pytest.mark.timeout(90)
def test_user_token_file_is_written_at_first_start_only(tmp_path: Path) -> None:
    db, token_file = tmp_path / "crew.db", tmp_path / "secrets" / "user-token"
    token_file.parent.mkdir()
    first, _ = run_until_healthy(
        db, "--dev", "--user-token-file", str(token_file), token_file=token_file
    )
    token = token_file.read_text().strip()
    assert token.startswith("cru_") and token not in first and "cru_" not in first
    assert f"user token written to {token_file}" in first
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert [p.name for p in token_file.parent.iterdir()] == ["user-token"]  # no temp left
    # a restart finds the token in the database and leaves the file alone
    token_file.write_text("left alone\n")
    second, _ = run_until_healthy(db, "--dev", "--user-token-file", str(token_file))
    assert token_file.read_text() == "left alone\n" and "user token" not in second


@pytest.mark.timeout(90)
def test_reset_user_token_writes_the_new_one_to_the_file(tmp_path: Path) -> None:
    db, token_file = tmp_path / "crew.db", tmp_path / "user-token"
    run_until_healthy(db, "--user-token-file", str(token_file))
    old = token_file.read_text().strip()
    out, _ = run_until_healthy(
        db, "--reset-user-token", "--user-token-file", str(token_file), token_file=token_file
    )
    new = token_file.read_text().strip()
    assert new != old and new.startswith("cru_") and "cru_" not in out
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600


@pytest.mark.timeout(90)
def test_an_unwritable_token_file_stores_no_token(tmp_path: Path) -> None:
    db, nowhere = tmp_path / "crew.db", tmp_path / "missing-dir" / "user-token"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "crew_server",
            "--db",
            str(db),
            "--port",
            str(free_port()),
            "--user-token-file",
            str(nowhere),
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert str(nowhere) in done.stderr and "cru_" not in done.stdout + done.stderr
    # the token was not kept, so the next start creates (and shows) one
    out, _ = run_until_healthy(db)
    assert "user token (shown once" in out


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


def crew_server(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crew_server", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_a_database_that_cannot_open_is_not_announced_as_serving(tmp_path: Path) -> None:
    done = crew_server("--db", str(tmp_path / "missing" / "dir" / "crew.db"), "--port", "0")
    assert done.returncode == 1
    assert "serving" not in done.stdout, done.stdout
    assert "cannot open the database" in done.stderr


@pytest.mark.parametrize("host", ["192.0.2.1", "no-such-host.invalid"])
def test_a_bad_host_is_called_a_bad_host_not_a_busy_port(tmp_path: Path, host: str) -> None:
    done = crew_server("--db", str(tmp_path / "crew.db"), "--host", host, "--port", "0")
    assert done.returncode == 1 and done.stdout == ""
    assert f"--host {host} is not an address of this machine" in done.stderr, done.stderr
    assert "--port" not in done.stderr
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_a_port_out_of_range_is_a_usage_error(tmp_path: Path, port: str) -> None:
    done = crew_server("--db", str(tmp_path / "crew.db"), "--port", port)
    assert done.returncode == 2 and "is not a port" in done.stderr
    assert "Traceback" not in done.stderr
