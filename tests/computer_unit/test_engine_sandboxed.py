"""OpenCodeEngine through the REAL sandbox launcher (bwrap), with the fake `opencode`.

Proves what only a real sandboxed run can: the exact env reaches the engine,
`crew` (bin/crew → this interpreter, isolated) works inside the sandbox, a
zsh heredoc works, stop ends the group, the output cap holds, a vanished
session is retried, and a background process neither outlives the turn nor
hangs it.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from computer_service.engine.base import FailureClass, SessionPlan
from computer_service.gateway.access import PLACEHOLDER_PREFIX
from crew_harness.waiting import wait_until_async
from tests.computer_unit.engine_fixtures import AUTH, BASE_PATH, Rig, sandboxed_rig
from tests.launcher.helpers import processes_with

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with sandboxed_rig(tmp_path) as rig:
        yield rig


async def test_ok_turn_exact_env_in_the_sandbox(rig: Rig) -> None:
    result = await rig.turn("FAKE:TOOL")
    assert result.status == "succeeded", result.failure
    assert [e.type for e in rig.events][:3] == ["step_start", "tool_use", "step_finish"]
    (dump,) = rig.dumps()
    env = dump["env"]
    # The login's key stays with the model gateway (issue 23): the placeholder here.
    [key] = [e["key"] for e in json.loads(env.pop("OPENCODE_AUTH_CONTENT")).values()]
    assert key.startswith(PLACEHOLDER_PREFIX) and AUTH["local"]["key"] not in json.dumps(env)
    assert json.loads(env.pop("OPENCODE_CONFIG_CONTENT"))["model"] == "local/scripted"
    p = rig.paths
    # The sandbox's own: the launcher's tool shell (sandbox_launcher/tool_shell.py).
    shell = env.pop("SHELL")
    assert shell.startswith(f"{p.crew_home}/tool-shell/") and shell.endswith("/bash"), shell
    assert env == {
        # First the engine's own git and rg (sandbox_launcher/tool_shell.py).
        "PATH": f"{Path(shell).parent}/crew-engine-bin:{rig.run.bin_dir}:{BASE_PATH}",
        "LANG": "C.UTF-8",
        "TMPDIR": str(p.tmp_dir),
        "TMPPREFIX": str(p.tmp_dir / "zsh"),
        "HOME": str(p.agent_dir),
        "XDG_DATA_HOME": str(p.data_dir),
        "XDG_CONFIG_HOME": str(p.config_dir),
        "XDG_CACHE_HOME": str(p.cache_dir),
        "XDG_STATE_HOME": str(p.state_dir),
        "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "PWD": str(p.work_dir),
        "CREW_SERVER_URL": "http://127.0.0.1:9",
        "CREW_TOKEN_FILE": str(p.token_file),
        "CREW_TURN_FILE": str(p.turn_file),
    }
    assert dump["argv"][1:] == [
        "run", "--pure", "--format", "json", "--print-logs", "--auto", "--title", "crew turn",
        "--dir", str(p.work_dir), "--model", "local/scripted",
    ]  # fmt: skip


async def test_crew_and_zsh_heredoc_work_inside(rig: Rig) -> None:
    heredoc = "zsh -c \"$(printf 'cat <<EOF\\nheredoc-ok\\nEOF')\""
    cmd = f"command -v crew && crew --help | head -3 && {heredoc}"
    result = await rig.turn(f"FAKE:RUN {cmd}")
    assert result.status == "succeeded", result.failure
    tool = next(e for e in rig.events if e.type == "tool_use")
    out = tool.data["output"]
    assert out.startswith(f"{rig.run.bin_dir}/crew\n"), out
    assert "crew reply" in out, out
    assert "heredoc-ok" in out, out


async def test_vanished_session_restarts_once(rig: Rig) -> None:
    result = await rig.turn("hi", plan=SessionPlan("ses_gone123"))
    assert result.status == "succeeded", result.failure
    argvs = [d["argv"] for d in rig.dumps()]
    assert len(argvs) == 2 and "--session" in argvs[0] and "--session" not in argvs[1]


async def test_failure_class_through_the_sandbox(rig: Rig) -> None:
    result = await rig.turn("FAKE:401")
    assert result.failure is not None and result.failure.cls is FailureClass.NOT_LOGGED_IN


async def test_stop_ends_the_turn(rig: Rig) -> None:
    stop = anyio.Event()

    async def stop_soon() -> None:
        await wait_until_async("the engine to start", rig.dumps)
        stop.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_soon)
        t0 = time.monotonic()
        result = await rig.turn("FAKE:HANG", stop=stop)
    assert result.status == "cancelled"
    assert time.monotonic() - t0 < 15


async def test_output_cap(rig: Rig) -> None:
    assert rig.engine is not None
    rig.engine.preparation.stdout_limit = 1024 * 1024
    result = await rig.turn("FAKE:FLOOD")
    assert result.failure is not None and result.failure.cls is FailureClass.OUTPUT_TOO_LARGE


async def test_background_process_neither_hangs_nor_outlives_the_turn(rig: Rig) -> None:
    t0 = time.monotonic()
    seconds = f"{3 + random.random():.6f}"  # also marks the background process
    result = await rig.turn(f"FAKE:BG {seconds}")
    took = time.monotonic() - t0
    assert result.status == "succeeded", result.failure
    assert took < 3, f"the turn waited for the background process ({took:.1f} s)"
    # Gone either because the turn killed it or because it touched the file.
    await wait_until_async("the background process gone", lambda: not processes_with(seconds))
    assert not (rig.paths.work_dir / "bg-survived").exists()
