"""An agent's capabilities with the REAL `opencode` in the real sandbox (issue 27).

One cold turn of an agent with a local stdio MCP server (`crew_testkit/mcp_stdio.py`,
copied into its work directory: the sandbox sees no repository), one whose program does
not exist, a remote one on loopback behind a secret header (reached through the agent's
gateway) and a skill; the scripted model calls the MCP tools and a bash tool that looks
for the local server's secret in every process environment it can read. Checks what only
the real binary and sandbox can: OpenCode's `mcp`/`skills` config is the one it reads, the
tools are `<server>_<tool>`, a missing program leaves the others working, the server has
its `secret_environment` and a tool cannot read it, the secret header never enters the
sandbox, no file holds a secret, and the MCP process is gone when the engine is.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from crew_common.capabilities import parse
from crew_testkit import mcp_stdio
from crew_testkit.mcp_remote import RemoteMCPServer
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
LOCAL_SECRET = "sekrit-local-env-4417"
HEADER_SECRET = "Bearer sekrit-remote-hdr-9902"
SKILL_DESCRIPTION = "SKILLDESC-3c1 how this crew writes release notes"

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.timeout(240)]


def _script() -> dict:
    # The secret split in two: the tool's own command line must not be what matches.
    half = len(LOCAL_SECRET) // 2
    look = (
        "(for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done) 2>/dev/null"
        f" | grep -c '{LOCAL_SECRET[:half]}''{LOCAL_SECRET[half:]}'; echo LOOKED"
    )
    calls = [
        {"name": "notes_echo_note", "arguments": {"note": "from-the-model"}},
        {"name": "notes_env_has", "arguments": {"name": "NOTES_TOKEN"}},
        {"name": "notes_env_has", "arguments": {"name": "OPENCODE_CONFIG_CONTENT"}},
        {"name": "notes_whoami", "arguments": {}},
        {"name": "remote_echo_note", "arguments": {"note": "far"}},
    ]
    rules = [{"request": i + 1, "reply": {"tool_calls": [c]}} for i, c in enumerate(calls)]
    rules.append({"request": len(calls) + 1, "reply": {"bash": look}})
    rules.append({"reply": {"text": "done"}})
    return {"rules": rules}


def _capabilities(remote_url: str) -> dict:
    return {
        "mcp_servers": [
            {
                "type": "local",
                "name": "notes",
                "command": ["python3", "-I", "mcp_stdio.py"],
                "environment": {"NOTES_DIR": "notes"},
                "secret_environment": {"NOTES_TOKEN": LOCAL_SECRET},
            },
            {"type": "local", "name": "broken", "command": ["/nonexistent/mcp-server"]},
            {
                "type": "remote",
                "name": "remote",
                "url": remote_url,
                "secret_headers": {"Authorization": HEADER_SECRET},
            },
        ],
        "skills": [
            {
                "name": "release-notes",
                "description": SKILL_DESCRIPTION,
                "body": "# Release notes\nSKILLBODY-8d2 Write them short.\n",
                "files": {"templates/notes.md": "- item\n"},
            }
        ],
    }


def _files_containing(root: Path, needles: list[str]) -> list[str]:
    found = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if any(n.encode() in data for n in needles):
                found.append(str(path))
    return found


async def test_mcp_servers_and_skills_in_a_sandboxed_turn(tmp_path: Path) -> None:
    if not OPENCODE.exists():
        required_in_ci("OpenCode (scripts/setup installs it into tools/opencode)")
    from crew_harness.scripted_model import Script, ScriptedModel, opencode_provider

    with (
        ScriptedModel(Script.parse(_script())) as model,
        RemoteMCPServer(secret_header=("Authorization", HEADER_SECRET)) as remote,
    ):
        config = Path(os.environ["HOME"]) / ".config" / "opencode" / "opencode.json"
        config.parent.mkdir(parents=True)
        config.write_text(json.dumps({"provider": opencode_provider(model.base_url)}))
        async with sandboxed_rig(tmp_path, str(OPENCODE)) as rig:
            shutil.copy(mcp_stdio.__file__, rig.paths.work_dir / "mcp_stdio.py")
            result = await rig.turn(
                "Use your tools.", capabilities=parse(_capabilities(remote.url))
            )
            assert result.status == "succeeded", (result.failure, [e.data for e in rig.events])
            crew_home = rig.crew_home
        uses = [e.data for e in rig.events if e.type == "tool_use"]
        tools = {e["tool"]: e for e in uses}
    requests = model.requests()
    first = json.dumps(requests[0].body)
    # Tools named <server>_<tool>; the broken server's are missing, the others are there.
    names = [t["function"]["name"] for t in requests[0].body.get("tools", [])]
    assert {"notes_echo_note", "remote_echo_note", "skill"} <= set(names), names
    assert not [n for n in names if n.startswith("broken_")]
    # The skill's description reaches the model (its body only when loaded).
    assert SKILL_DESCRIPTION in first and "SKILLBODY-8d2" not in first
    # MCP calls are tool events like built-in ones: name, input, output, duration.
    echo = tools["notes_echo_note"]
    assert echo["input"] == {"note": "from-the-model"} and not echo["failed"]
    assert echo["output"] == "MCP-ECHO-MARKER-7f3a from-the-model"
    assert isinstance(echo["duration_ms"], int)
    # The server has its secret, but not the engine's config (with every server's secrets):
    # it runs through the tool shell, as a tool does.
    has = [u["output"] for u in uses if u["tool"] == "notes_env_has"]
    assert has == ["set", "unset"], has
    assert tools["remote_echo_note"]["output"] == "MCP-REMOTE-MARKER-c41d far"
    # No tool could read the local server's secret from any process environment it sees.
    assert tools["bash"]["output"].split() == ["0", "LOOKED"], tools["bash"]
    # The remote server got the secret header from the gateway on every request.
    assert remote.requests and all(
        r["headers"].get("authorization") == HEADER_SECRET for r in remote.requests
    )
    assert remote.rejected == 0
    # The local server ran in the sandbox (another pid namespace: its own pid is small,
    # its HOME the agent's) and is gone with its engine.
    who = json.loads(tools["notes_whoami"]["output"])
    assert who["home"] == str(rig.paths.agent_dir)
    assert _running_in(rig.paths.work_dir, "mcp_stdio.py") == []
    # No file anywhere in the crew home holds a secret.
    assert _files_containing(crew_home, [LOCAL_SECRET, HEADER_SECRET.split()[1]]) == []


def _running_in(cwd: Path, name: str) -> list[int]:
    """The host's processes running `name` with `cwd` as their working directory."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if name in (proc / "cmdline").read_text(errors="replace") and os.readlink(
                proc / "cwd"
            ) == str(cwd):
                found.append(int(proc.name))
        except OSError:
            continue
    return found
