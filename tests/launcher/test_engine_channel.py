"""The engine's stdout is a channel its tools cannot write to (issue 12, "forged events").

A tool started by the engine — stdout a pipe to the engine, as OpenCode starts
its bash commands — opens `/proc/<engine>/fd/1` and writes a `step_finish`
with a huge cost. With a pipe as the engine's stdout that is a second writer
and the line reaches the launcher's frames as if the engine had printed it;
with the socket the launcher gives it (`engine_run.engine_channel`) the open
fails with ENXIO. Both Linux modes, through a real launcher.
"""

from __future__ import annotations

import errno

import orjson

from tests.launcher.helpers import CrewLayout, LauncherProcess, engine_lines


def test_a_tool_cannot_write_into_the_engines_stdout(
    launcher: LauncherProcess, layout: CrewLayout
) -> None:
    layout.add_agent("a1")
    frames = launcher.run(layout.run_request("a1", {"scenario": "forge"}))
    assert frames[-1]["t"] == "exit" and frames[-1]["code"] == 0, frames
    lines = engine_lines(frames)
    assert not [x for x in lines if x.get("type") == "step_finish"], lines
    [tool] = [x for x in lines if x.get("event") == "tool"]
    assert orjson.loads(tool["stdout"]) == {"ppid": errno.ENXIO, "self_parent_fd": errno.ENXIO}
    assert [x.get("event") for x in lines] == ["before", "tool"]
