"""Runs through a real launcher process and real bwrap, in both Linux modes."""

from __future__ import annotations

import pytest

from tests.launcher.helpers import CrewLayout, LauncherProcess, engine_lines


@pytest.mark.timeout(60)
def test_echo_run_builds_argv_env_and_streams_frames(
    launcher: LauncherProcess, layout: CrewLayout
) -> None:
    layout.add_agent("alice")
    body = layout.run_request("alice", {"scenario": "echo", "exit": 3, "stderr_bytes": 70000})
    frames = launcher.run(body)
    assert frames[0]["t"] == "started" and frames[0]["pid"] > 0
    assert frames[-1]["t"] == "exit"
    seen = engine_lines(frames)[0]
    print(seen)
    print(frames[-1])
