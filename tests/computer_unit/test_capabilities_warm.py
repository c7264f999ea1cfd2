"""An agent's MCP servers on a REAL warm `opencode serve` in the real sandbox (issue 27).

The local MCP server is a child of the agent's warm server: it runs while the server
does, its state comes from OpenCode's `GET /mcp` (a missing program: `failed` with the
reason, the other server `connected`), a change of the capabilities starts a new server
(the old one's MCP process gone) and the session goes on, and stopping the server ends
its MCP process.
"""

from __future__ import annotations

import json
import os
import shutil
import types
from pathlib import Path

import pytest

from computer_service.engine.cold_run import ColdRun
from computer_service.engine.pipeline import OpenCodeEngine
from computer_service.engine.warm_pool import WarmPool
from computer_service.engine.warm_run import WarmRun
from computer_service.parts import CurrentLauncher
from crew_common.capabilities import parse
from crew_testkit import mcp_stdio
from tests.computer_unit.engine_fixtures import sandboxed_rig
from tests.support.ci import required_in_ci

OPENCODE = (
    Path(__file__).resolve().parents[2]
    / "tools"
    / "opencode"
    / "node_modules"
    / ".bin"
    / "opencode"
)

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.timeout(300)]


def _capabilities(notes_dir: str) -> dict:
    return {
        "mcp_servers": [
            {
                "type": "local",
                "name": "notes",
                "command": ["python3", "-I", "mcp_stdio.py"],
                "environment": {"NOTES_DIR": notes_dir},
            },
            {"type": "local", "name": "broken", "command": ["/nonexistent/mcp-server"]},
        ]
    }


def _mcp_processes(cwd: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if "mcp_stdio.py" in (proc / "cmdline").read_text(errors="replace") and os.readlink(
                proc / "cwd"
            ) == str(cwd):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


async def test_mcp_servers_live_and_die_with_the_warm_server(tmp_path: Path) -> None:
    if not OPENCODE.exists():
        required_in_ci("OpenCode (scripts/setup installs it into tools/opencode)")
    from crew_harness.scripted_model import Script, ScriptedModel, opencode_provider

    call = {"name": "notes_echo_note", "arguments": {"note": "warm"}}
    script = Script.parse({"rules": [{"request": 1, "reply": {"tool_calls": [call]}}]})
    with ScriptedModel(script) as model:
        config = Path(os.environ["HOME"]) / ".config" / "opencode" / "opencode.json"
        config.parent.mkdir(parents=True)
        config.write_text(json.dumps({"provider": opencode_provider(model.base_url)}))
        async with sandboxed_rig(tmp_path, str(OPENCODE)) as rig:
            assert rig.engine is not None
            launcher = CurrentLauncher(types.SimpleNamespace(client=rig.engine.way.launcher))  # type: ignore[arg-type]
            pool = WarmPool(launcher, memory_budget=1 << 40)
            rig.engine = OpenCodeEngine(
                rig.engine.preparation, WarmRun(ColdRun(rig.engine.way.launcher), pool)
            )
            shutil.copy(mcp_stdio.__file__, rig.paths.work_dir / "mcp_stdio.py")
            agent = rig.paths.agent_id

            first = await rig.turn("Use notes.", capabilities=parse(_capabilities("a")))
            assert first.status == "succeeded", (first.failure, [e.data for e in rig.events])
            tools = [e.data for e in rig.events if e.type == "tool_use"]
            assert [t["output"] for t in tools] == ["MCP-ECHO-MARKER-7f3a warm"]
            assert pool.counters.warm_turns == 1
            states = {s["name"]: s for s in pool.agent_status(agent)["mcp_servers"] or []}
            assert states["notes"]["state"] == "connected", states
            assert states["broken"]["state"] == "failed" and states["broken"]["reason"]
            server = pool.servers[agent]
            (mcp_one,) = _mcp_processes(rig.paths.work_dir)  # alive with its warm server

            # Another document: a new server (and MCP process), the same session.
            second = await rig.turn(
                "Again.", plan=rig.plan(), capabilities=parse(_capabilities("b"))
            )
            assert second.status == "succeeded", second.failure
            assert second.session_id == first.session_id
            assert pool.servers[agent] is not server
            assert pool.counters.warm_turns == 2 and pool.counters.starts == 2
            running = _mcp_processes(rig.paths.work_dir)
            assert mcp_one not in running and len(running) == 1

            await pool.discard(pool.servers[agent])
            assert _mcp_processes(rig.paths.work_dir) == []
