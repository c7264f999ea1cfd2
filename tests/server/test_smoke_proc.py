"""The real `crew-server --dev` subprocess starts, answers, and serves the user API."""

from __future__ import annotations

from pathlib import Path

import pytest

from crew_testkit.crew_server_proc import start_crew_server


@pytest.mark.timeout(60)
def test_subprocess_server_serves_the_user_api(tmp_path: Path) -> None:
    with start_crew_server(tmp_path) as server:
        computer = server.create_computer()
        alice = server.create_agent("alice", computer_id=computer["computer_id"])
        room = server.create_room("dm", [alice["id"]])
        first = server.post(room["id"], "hello @alice")
        assert first["seq"] == 1
        assert first["mentions"] == [alice["id"]]
        assert [m["body"] for m in server.messages(room["id"])] == ["hello @alice"]
        assert server.agents()[0]["status"] == "idle"
    assert server.process.poll() is not None
    assert (tmp_path / "crew.db").exists()
