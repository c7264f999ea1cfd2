"""Warm server requests: the cold run's rules, the password only here, and the server's argv."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from crew_common.launcher_wire import ServerRequest
from sandbox_launcher.launcher import RequestRefused
from tests.launcher.helpers import CrewLayout
from tests.launcher.inprocess import SECRET, inprocess_app, inprocess_launcher

PASSWORD = "p" * 40


def server_body(layout: CrewLayout, agent_id: str, **env: str) -> dict[str, Any]:
    body = layout.run_request(agent_id, {})
    for key in ("run_id", "model", "session_id", "stdin"):
        body.pop(key)
    body["env"].update(env)
    return body


async def post(layout: CrewLayout, opencode: Path, path: str, body: Any = None) -> httpx.Response:
    app = inprocess_app(inprocess_launcher(layout, opencode))
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {SECRET}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://l", headers=headers) as c:
        return await c.post(path, json=body)


@pytest.mark.anyio
async def test_a_server_needs_its_password_and_a_run_may_not_carry_one(
    layout: CrewLayout, fake_opencode: Path
) -> None:
    layout.add_agent("alice")
    missing = await post(layout, fake_opencode, "/servers", server_body(layout, "alice"))
    assert missing.status_code == 400
    assert "OPENCODE_SERVER_PASSWORD is required" in missing.json()["error"]["message"]
    short = server_body(layout, "alice", OPENCODE_SERVER_PASSWORD="short")
    assert (await post(layout, fake_opencode, "/servers", short)).status_code == 400
    run = layout.run_request("alice", {})
    run["env"]["OPENCODE_SERVER_PASSWORD"] = PASSWORD
    refused = await post(layout, fake_opencode, "/runs", run)
    assert refused.status_code == 400
    assert "OPENCODE_SERVER_PASSWORD" in refused.json()["error"]["message"]
    assert PASSWORD not in refused.text


@pytest.mark.anyio
async def test_a_server_gets_the_cold_runs_path_rules(
    layout: CrewLayout, fake_opencode: Path
) -> None:
    layout.add_agent("alice")
    layout.add_agent("bob")
    body = server_body(layout, "alice", OPENCODE_SERVER_PASSWORD=PASSWORD)
    body["agent_dir"] = str(layout.agent_dir("bob"))
    answer = await post(layout, fake_opencode, "/servers", body)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "path_refused"
    for path in ("/servers/alice/sweep", "/servers/alice/stop"):
        gone = await post(layout, fake_opencode, path)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "unknown_server"


def test_the_server_runs_sandboxed_as_serve_on_loopback_with_the_runs_environment(
    layout: CrewLayout, fake_opencode: Path
) -> None:
    layout.add_agent("alice")
    launcher = inprocess_launcher(layout, fake_opencode)
    request = ServerRequest.model_validate(
        server_body(layout, "alice", OPENCODE_SERVER_PASSWORD=PASSWORD)
    )
    server = launcher.prepare_server(request)
    assert server.argv[:3] == ["/usr/bin/env", "--ignore-signal=INT", "/usr/bin/bwrap"]
    assert "--unshare-pid" in server.argv
    assert server.argv[-8:] == [
        str(fake_opencode.resolve()),
        "serve",
        "--pure",
        "--print-logs",
        "--port",
        "0",
        "--hostname",
        "127.0.0.1",
    ]
    assert server.env["OPENCODE_SERVER_PASSWORD"] == PASSWORD
    assert server.env["PWD"] == str(layout.agent_dir("alice") / "work")
    launcher.servers.claim(server)  # as `Launcher.start_server` does before starting
    with pytest.raises(RequestRefused) as refused:
        launcher.prepare_server(request)
    assert refused.value.code == "server_exists"
