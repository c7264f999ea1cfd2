"""`POST /models` leaves the user's home alone: scratch XDG dirs, credentials and providers passed in.

The Computer reads the user's OpenCode setup (`models_request`) and sends it;
the launcher checks it, writes it into scratch directories and runs.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from computer_service.parts import models_request
from crew_common.launcher_wire import ModelsRequest
from crew_harness.demo import scripted_price_table
from sandbox_launcher.models import list_models
from tests.launcher.helpers import CrewLayout, LauncherProcess, make_layout
from tests.launcher.inprocess import SECRET, inprocess_app, inprocess_launcher
from tests.support.ci import required_in_ci

OPENCODE = Path(__file__).resolve().parents[2] / "tools" / "opencode" / "node_modules" / ".bin"
OPENCODE = OPENCODE / "opencode"
AUTH = {"acme": {"type": "api", "key": "acme-not-a-real-key-0123456789"}}
PROVIDERS = {
    "local": {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Local",
        "options": {"baseURL": "http://127.0.0.1:9/v1"},
        "models": {"scripted": {"name": "Scripted"}},
    }
}

# Records what `opencode models` got, then writes where OpenCode writes.
FAKE = """
import json, os, sys
record = {"env": dict(os.environ), "cwd": os.getcwd(), "stub": os.path.exists(
    os.path.join(os.environ["XDG_CONFIG_HOME"], "opencode", "package-lock.json"))}
prices = os.path.join(os.environ["XDG_CACHE_HOME"], "opencode", "models.json")
record["prices"] = open(prices).read() if os.path.exists(prices) else None
for var in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
    os.makedirs(os.path.join(os.environ[var], "opencode", "log"), exist_ok=True)
    open(os.path.join(os.environ[var], "opencode", "log", "x.log"), "w").write("x")
open(sys.argv[1], "w").write(json.dumps(record))
print("local/scripted")
"""


def price_table() -> dict[str, object]:
    """The user's catalog (models.dev style): `acme` is listed only for a user logged in to it."""
    acme = scripted_price_table()["local"]
    model = {**acme["models"]["scripted"], "id": "m1", "name": "M1"}
    return {
        "acme": {**acme, "id": "acme", "name": "Acme", "env": ["ACME_KEY"], "models": {"m1": model}}
    }


def user_setup(home: Path) -> None:
    """The user's own OpenCode login, config (JSONC) and price table, at the XDG defaults."""
    auth = home / ".local" / "share" / "opencode" / "auth.json"
    auth.parent.mkdir(parents=True)
    auth.write_text(json.dumps(AUTH))
    config = home / ".config" / "opencode" / "opencode.jsonc"
    config.parent.mkdir(parents=True)
    config.write_text('// mine\n{"provider": ' + json.dumps(PROVIDERS) + ', "theme": "x"}\n')
    prices = home / ".cache" / "opencode" / "models.json"
    prices.parent.mkdir(parents=True)
    prices.write_text(json.dumps(price_table()))


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path below `root` with its size and mtime: any write shows."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            found[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_size, st.st_mtime_ns)
    return found


def scratch_dirs() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("crew-models-")}


@pytest.mark.anyio
async def test_models_run_in_scratch_dirs_with_the_users_setup_passed_in(
    isolated_home: Path, tmp_path: Path
) -> None:
    user_setup(isolated_home)
    fake = tmp_path / "bin" / "opencode"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable} -I\n" + FAKE)
    fake.chmod(0o755)
    record_file = tmp_path / "record.json"
    before_home, before_scratch = tree(isolated_home), scratch_dirs()

    # A wrapper names the record file: an argument of `opencode models` is a provider filter.
    wrapper = tmp_path / "bin" / "opencode-recording"
    wrapper.write_text(f"#!/bin/sh\nexec {fake} {record_file}\n")
    wrapper.chmod(0o755)
    # What the Computer sends, as the launcher parses it.
    sent = models_request(os.environ).model_dump_json()
    found = await list_models(str(wrapper), ModelsRequest.model_validate_json(sent))
    assert found == ["local/scripted"]

    record = json.loads(record_file.read_text())
    env = record["env"]
    scratch = Path(env["XDG_DATA_HOME"]).parent
    assert scratch.name.startswith("crew-models-") and not scratch.exists()  # removed afterwards
    for var, sub in (
        ("DATA", "data"),
        ("CONFIG", "config"),
        ("CACHE", "cache"),
        ("STATE", "state"),
    ):
        assert env[f"XDG_{var}_HOME"] == str(scratch / sub)
    assert record["cwd"] == env["PWD"] == str(scratch / "work")
    assert record["stub"] is True
    assert json.loads(record["prices"]) == price_table()
    # Who is logged in, never the key: the model gateway holds it (issue 23).
    assert json.loads(env["OPENCODE_AUTH_CONTENT"]) == {
        "acme": {"type": "api", "key": "crew-gateway-holds-this"}
    }
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    assert config["provider"] == PROVIDERS and "theme" not in config
    assert env["OPENCODE_DISABLE_PROJECT_CONFIG"] == env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    assert env["HOME"] == str(isolated_home)  # the rest of the user's environment stays
    assert tree(isolated_home) == before_home
    assert scratch_dirs() == before_scratch


@pytest.mark.timeout(60)
def test_real_opencode_models_write_nothing_into_the_users_home(isolated_home: Path) -> None:
    if not OPENCODE.exists():
        required_in_ci("OpenCode (scripts/setup installs it into tools/opencode)")
    user_setup(isolated_home)
    layout = make_layout(isolated_home)
    before_scratch = scratch_dirs()
    assert "ACME_KEY" not in os.environ
    launcher = LauncherProcess(layout, OPENCODE)
    try:
        before = tree(isolated_home)
        with launcher.client(timeout=45) as client:
            answer = client.post("/models", json=models_request(os.environ).model_dump())
        after = tree(isolated_home)
    finally:
        launcher.stop()
    assert answer.status_code == 200, answer.text
    models = answer.json()["models"]
    assert "local/scripted" in models  # the provider section went in
    assert "acme/m1" in models  # the credentials and the price table went in
    assert after == before
    for xdg in (".local/share", ".local/state", ".config", ".cache"):
        assert not [p for p in after if p.startswith(xdg + "/opencode/") and p not in before]
    assert scratch_dirs() == before_scratch


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"env": {"HOME": "/elsewhere"}}, "environment keys not allowed: HOME"),
        ({"env": {"XDG_CACHE_HOME": "/x"}}, "environment keys not allowed: XDG_CACHE_HOME"),
        ({"env": {"OPENCODE_AUTH_CONTENT": "a\x00b"}}, "contains a NUL byte"),
        ({"env": {}, "price_table": "{\x00}"}, "contains a NUL byte"),
        ({"env": {}, "argv": ["--rm"]}, "argv: Extra inputs are not permitted"),
        ("not json", "invalid models request"),
    ],
)
async def test_models_request_is_checked_before_anything_runs(
    layout: CrewLayout, tmp_path: Path, body: object, reason: str
) -> None:
    ran = tmp_path / "ran"
    fake = tmp_path / "opencode"
    fake.write_text(f"#!/bin/sh\ntouch {ran}\n")
    fake.chmod(0o755)
    transport = httpx.ASGITransport(app=inprocess_app(inprocess_launcher(layout, fake)))
    async with httpx.AsyncClient(transport=transport, base_url="http://launcher") as client:
        headers = {"Authorization": f"Bearer {SECRET}"}
        if isinstance(body, str):
            answer = await client.post("/models", content=body, headers=headers)
        else:
            answer = await client.post("/models", json=body, headers=headers)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_request"
    assert reason in answer.json()["error"]["message"]
    assert not ran.exists()


@pytest.mark.anyio
async def test_models_are_listed_when_the_sandbox_is_unusable(
    layout: CrewLayout, tmp_path: Path
) -> None:
    # `opencode models` runs outside the sandbox: a failed self-test does not stop the list.
    fake = tmp_path / "opencode"
    fake.write_text("#!/bin/sh\necho local/scripted\n")
    fake.chmod(0o755)
    launcher = inprocess_launcher(layout, fake, ok=False)
    transport = httpx.ASGITransport(app=inprocess_app(launcher))
    async with httpx.AsyncClient(transport=transport, base_url="http://launcher") as client:
        headers = {"Authorization": f"Bearer {SECRET}"}
        answer = await client.post("/models", json={"env": {}}, headers=headers)
        runs = await client.post("/runs", json=layout.run_request("a", {}), headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"models": ["local/scripted"]}
    assert runs.status_code == 503  # while no run starts without a sandbox
