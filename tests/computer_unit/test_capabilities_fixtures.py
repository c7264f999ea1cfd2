"""The MCP test servers (crew_testkit/mcp_stdio.py, mcp_remote.py) speak MCP as clients expect."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from crew_testkit import mcp_stdio
from crew_testkit.mcp_remote import RemoteMCPServer

STDIO = Path(mcp_stdio.__file__)


def _rpc(msg_id: int | None, method: str, params: dict | None = None) -> dict:
    out: dict = {"jsonrpc": "2.0", "method": method}
    if msg_id is not None:
        out["id"] = msg_id
    if params is not None:
        out["params"] = params
    return out


def test_stdio_server_initializes_lists_and_calls(tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    lines = [
        _rpc(1, "initialize", {"protocolVersion": "2025-03-26", "capabilities": {}}),
        _rpc(None, "notifications/initialized"),
        _rpc(2, "tools/list"),
        _rpc(3, "tools/call", {"name": "echo_note", "arguments": {"note": "hello"}}),
        _rpc(4, "nope/nope"),
    ]
    done = subprocess.run(
        [sys.executable, "-I", str(STDIO), "--marker", "MK", "--record", str(record)],
        input="".join(json.dumps(m) + "\n" for m in lines),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["id"] for a in answers] == [1, 2, 3, 4]  # the notification got no answer
    assert answers[0]["result"]["protocolVersion"] == "2025-03-26"
    assert "echo_note" in [t["name"] for t in answers[1]["result"]["tools"]]
    assert answers[2]["result"]["content"] == [{"type": "text", "text": "MK hello"}]
    assert answers[3]["error"]["code"] == -32601
    recorded = [json.loads(line)["method"] for line in record.read_text().splitlines()]
    assert recorded[:4] == ["initialize", "notifications/initialized", "tools/list", "tools/call"]


def test_remote_server_requires_its_secret_header() -> None:
    with RemoteMCPServer(secret_header=("X-Api-Key", "s3cret")) as server:
        init = _rpc(1, "initialize", {"protocolVersion": "2025-06-18"})
        refused = httpx.post(server.url, json=init)
        assert refused.status_code == 401
        ok = httpx.post(server.url, json=init, headers={"X-Api-Key": "s3cret"})
        assert ok.status_code == 200 and ok.headers["mcp-session-id"]
        note = httpx.post(
            server.url,
            json=_rpc(None, "notifications/initialized"),
            headers={"X-Api-Key": "s3cret"},
        )
        assert note.status_code == 202
        call = _rpc(2, "tools/call", {"name": "echo_note", "arguments": {"note": "x"}})
        answer = httpx.post(server.url, json=call, headers={"X-Api-Key": "s3cret"}).json()
        assert answer["result"]["content"][0]["text"] == "MCP-REMOTE-MARKER-c41d x"
        assert server.rejected == 1
        assert server.tool_calls() == [{"name": "echo_note", "arguments": {"note": "x"}}]
