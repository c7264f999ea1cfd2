"""`scripts/demo` as a user runs it: exit 0, the agent's reply and the turn record printed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from crew_harness.demo import write_scripted_login
from crew_harness.scripted_model import ScriptedModel, scenario
from tests.e2e.opencode_by_hand import OPENCODE, ROOT
from tests.support.ci import required_in_ci

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


@pytest.mark.parametrize("engine", ["warm", "cold"])
def test_demo_shows_the_reply_and_the_turn_record(tmp_path: Path, engine: str) -> None:
    if not OPENCODE.exists():
        required_in_ci("OpenCode (scripts/setup installs it into tools/opencode)")
    if shutil.which("bwrap") is None:
        required_in_ci("bubblewrap (apt-get install bubblewrap)")
    env = {k: v for k, v in os.environ.items() if k not in ("CREW_HOME",)}
    env["HOME"] = str(tmp_path)  # the demo must not need (or touch) the real home

    done = subprocess.run(
        [str(ROOT / "scripts" / "demo"), "--engine", engine],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=220,
        check=False,
    )

    out = done.stdout
    assert done.returncode == 0, f"stdout:\n{out}\nstderr:\n{done.stderr[-4000:]}"
    assert "Ada (@ada): Hello! I wrote hello.txt in my work directory." in out
    assert "succeeded" in out
    assert "tool bash (ok" in out
    assert "finished (tool-calls)" in out and "finished (stop)" in out
    # The cost comes from the copied price table: (99×3 + 20×15 + 10×0.3) / 1e6 per step.
    assert "cost $0.001200" in out
    assert out.rstrip().endswith("Stopped.")
    assert "Stopping crew-computer, crew-server and the scripted model …" in out
    assert "crew-computer  ready; crew home " in out
    assert "crew-computer exited" not in done.stderr  # the demo reports an unclean stop
    # scripts/setup's `opencode --version` check makes OpenCode create its (empty)
    # XDG directories; the demo itself must leave no file in HOME.
    left = [p for p in tmp_path.rglob("*") if not p.is_dir()]
    assert left == [], "the demo left files in HOME"


def test_demo_with_model_uses_the_users_own_opencode_login(tmp_path: Path) -> None:
    """`--model` reads the user's auth.json and provider config (here: the scripted model)."""
    if not OPENCODE.exists():
        required_in_ci("OpenCode (scripts/setup installs it into tools/opencode)")
    if shutil.which("bwrap") is None:
        required_in_ci("bubblewrap (apt-get install bubblewrap)")
    with ScriptedModel(scenario("crew")) as model:
        write_scripted_login(tmp_path, model.base_url, price_in_config=True)
        auth = tmp_path / ".local" / "share" / "opencode" / "auth.json"
        config = tmp_path / ".config" / "opencode" / "opencode.json"
        before = (auth.read_bytes(), config.read_bytes())
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "CREW_HOME"))}
        env["HOME"] = str(tmp_path)

        done = subprocess.run(
            [str(ROOT / "scripts" / "demo"), "--model", "local/scripted"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=220,
            check=False,
        )
        requests = model.requests()

    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"
    assert "your OpenCode login" in done.stdout
    # No scripted model was started by the demo: it does not claim to stop one.
    assert "Stopping crew-computer, crew-server …" in done.stdout
    assert "Ada (@ada): Hello! I wrote hello.txt in my work directory." in done.stdout
    assert requests and all(r.authorization == "Bearer scripted-key" for r in requests)
    assert (auth.read_bytes(), config.read_bytes()) == before  # read, never written


def test_web_demo_runs_the_engine_asked_for_and_names_the_crew_home(tmp_path: Path) -> None:
    """`--web --engine cold` used to run warm; the crew home was not printed."""
    if not OPENCODE.exists():
        required_in_ci("OpenCode (scripts/setup installs it into tools/opencode)")
    if shutil.which("bwrap") is None:
        required_in_ci("bubblewrap (apt-get install bubblewrap)")
    env = {k: v for k, v in os.environ.items() if k not in ("CREW_HOME",)}
    env["HOME"] = str(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "crew_harness.demo", "--web", "--engine", "cold"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    said: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            said.append(line)
            if line.startswith("Running until Ctrl+C"):
                break
        text = "".join(said)
        assert "engine cold" in text, text
        home_line = next(ln for ln in said if ln.strip().startswith("crew home"))
        crew_home = Path(home_line.rsplit(": ", 1)[1].strip())
        transport = httpx.HTTPTransport(uds=str(crew_home / "sockets" / "computer.sock"))
        with httpx.Client(transport=transport, base_url="http://computer") as local:
            assert local.get("/health").json()["warm"] is None  # cold: no warm servers
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
    assert proc.returncode == 0, rest
    assert "Stopping crew-computer, crew-server and the scripted model …" in rest
