"""`crew-server` says where it serves, and a busy port stops it before the user token is minted."""

from __future__ import annotations

import select
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from crew_harness.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def crew_server(db: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "crew_server", "--db", str(db), *extra]


def test_the_url_comes_first_and_answers_also_for_port_0(tmp_path: Path) -> None:
    process = subprocess.Popen(
        crew_server(tmp_path / "crew.db", "--port", "0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    try:
        ready, _, _ = select.select([process.stdout], [], [], 30)
        first = process.stdout.readline() if ready else ""
        prefix = "crew-server: serving http://127.0.0.1:"
        assert first.startswith(prefix), first
        url = first.removeprefix("crew-server: serving ").strip()
        assert not url.endswith(":0")  # the port it really got
        assert process.stdout.readline().startswith("user token (shown once")

        def healthy() -> bool:
            try:
                return httpx.get(f"{url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(f"{url}/health", healthy, 30)
    finally:
        process.terminate()
        process.communicate(timeout=20)
    assert process.returncode == 0


def test_a_busy_port_stops_it_before_a_token_is_minted(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            crew_server(tmp_path / "crew.db", "--port", str(port)),
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == 1
    assert done.stdout == ""  # no URL, no user token
    assert done.stderr == (
        f"crew-server: cannot listen on 127.0.0.1:{port} (Address already in use); "
        "stop what uses it or pick another --port\n"
    )
    assert not (tmp_path / "crew.db").exists()
