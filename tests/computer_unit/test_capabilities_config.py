"""An agent's capabilities materialised for its OpenCode (issue 27): config, skill files, sync.

Pure builders (`engine.capabilities`), the skills written by `home.write_skills`, the
agent record read from the server's sync, and a turn through the stand-in launcher with
the fake opencode: the engine's config holds the `mcp` and `skills` settings, the remote
server's secret header is nowhere the engine gets, and no file holds a secret.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from computer_service.engine.capabilities import (
    GATEWAY_HEADER,
    TOOL_SHELL_EXEC,
    mcp_routes,
    opencode_settings,
    secrets,
    skill_files,
    skill_md,
)
from computer_service.engine.warm_pool import env_key
from computer_service.home import skills_root, write_skills
from computer_service.upstream import AgentRecord
from crew_common.capabilities import parse
from crew_common.layout import AgentPaths
from tests.computer_unit.engine_fixtures import make_rig, standin_launcher

LOCAL_SECRET = "sekrit-env-value-5150"
HEADER_SECRET = "Bearer sekrit-header-6262"

DOCUMENT = {
    "mcp_servers": [
        {
            "type": "local",
            "name": "notes",
            "command": ["python3", "notes.py", "--dir", "a b"],
            "environment": {"NOTES_DIR": "notes"},
            "secret_environment": {"NOTES_TOKEN": LOCAL_SECRET},
            "timeout_ms": 7000,
        },
        {
            "type": "remote",
            "name": "github",
            "url": "https://mcp.example.com/v1/",
            "headers": {"X-Org": "acme"},
            "secret_headers": {"Authorization": HEADER_SECRET},
            "enabled": False,
        },
    ],
    "skills": [
        {
            "name": "release-notes",
            "description": 'How we write "release" notes: short',
            "body": "# Notes\nBe brief.",
            "files": {"templates/notes.md": "- item\n"},
        }
    ],
}


def test_the_opencode_settings_of_local_and_remote_servers_and_skills() -> None:
    settings = opencode_settings(
        parse(DOCUMENT), gateway_port=4100, placeholder="crew-gw-abc", skills_dir="/s/d1"
    )
    assert settings == {
        "mcp": {
            "notes": {
                "type": "local",
                # Started through the sandbox's tool shell, the argv unchanged after it.
                "command": [*TOOL_SHELL_EXEC, "python3", "notes.py", "--dir", "a b"],
                "environment": {"NOTES_DIR": "notes", "NOTES_TOKEN": LOCAL_SECRET},
                "enabled": True,
                "timeout": 7000,
            },
            "github": {
                "type": "remote",
                "url": "http://127.0.0.1:4100/mcp/github",
                "headers": {"X-Org": "acme", GATEWAY_HEADER: "crew-gw-abc"},
                "oauth": False,
                "enabled": False,
            },
        },
        "skills": {"paths": ["/s/d1"]},
    }
    assert HEADER_SECRET not in json.dumps(settings)
    assert opencode_settings(parse(None), gateway_port=1, placeholder="p", skills_dir="") == {}


def test_the_tool_shell_exec_runs_the_argv_unchanged(tmp_path: Path) -> None:
    import subprocess

    out = tmp_path / "argv.json"
    argv = ["python3", "-c", "import json,sys; json.dump(sys.argv, open(sys.argv[1], 'w'))"]
    subprocess.run(
        [*TOOL_SHELL_EXEC, *argv, str(out), "a b", "$HOME", "'q'"],
        env={"PATH": os.environ["PATH"], "SHELL": "/bin/bash"},
        check=True,
        timeout=30,
    )
    assert json.loads(out.read_text())[1:] == [str(out), "a b", "$HOME", "'q'"]


def test_routes_and_secrets() -> None:
    caps = parse(DOCUMENT)
    (route,) = mcp_routes(caps).values()
    assert route.url == "https://mcp.example.com/v1"
    assert route.headers == {"X-Org": "acme", "Authorization": HEADER_SECRET}
    assert sorted(secrets(caps)) == sorted([LOCAL_SECRET, HEADER_SECRET])


def test_skill_md_front_matter_is_quoted() -> None:
    text = skill_md("a-b", 'say "hi": now\nand then', "body")
    assert text == '---\nname: "a-b"\ndescription: "say \\"hi\\": now\\nand then"\n---\nbody\n'


def test_skills_are_written_by_digest_and_replaced(tmp_path: Path) -> None:
    paths = AgentPaths(tmp_path / "crew", "run-1", "agent-1")
    files = skill_files(parse(DOCUMENT))
    first = write_skills(paths, files)
    assert first is not None and first.parent == skills_root(paths)
    skill = (first / "release-notes" / "SKILL.md").read_text()
    assert skill.startswith('---\nname: "release-notes"\n') and "Be brief." in skill
    assert (first / "release-notes" / "templates" / "notes.md").read_text() == "- item\n"
    assert write_skills(paths, files) == first  # unchanged: the same directory
    changed = json.loads(json.dumps(DOCUMENT))
    changed["skills"][0]["body"] = "Be briefer."
    second = write_skills(paths, skill_files(parse(changed)))
    assert second is not None and second != first and not first.exists()
    assert write_skills(paths, []) is None and list(skills_root(paths).iterdir()) == []


def test_the_agent_record_reads_capabilities_and_refuses_a_bad_document() -> None:
    base = {"id": "a1", "handle": "a", "name": "A", "model": "local/scripted"}
    record = AgentRecord.model_validate(
        {**base, "capabilities": DOCUMENT, "capabilities_version": "v1"}
    )
    assert [s.name for s in record.capabilities.mcp_servers] == ["notes", "github"]
    assert record.problem() is None and record.capabilities_version == "v1"
    assert AgentRecord.model_validate(base).capabilities.mcp_servers == []
    bad = AgentRecord.model_validate({**base, "capabilities": {"mcp_servers": [{"x": 1}]}})
    assert bad.capabilities.mcp_servers == []
    assert bad.problem() is not None and "capabilities" in bad.problem()
    # A bad document replaces the runner (its settings differ), so it never runs without.
    assert bad.settings() != record.settings()


@pytest.mark.anyio
async def test_a_turn_gets_the_settings_and_no_file_holds_a_secret(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    async with standin_launcher() as (client, _):
        rig.use(client)
        first = await rig.turn("hi", capabilities=parse(DOCUMENT))
        again = await rig.turn("hi", capabilities=parse(DOCUMENT))
        changed = json.loads(json.dumps(DOCUMENT))
        changed["skills"][0]["description"] = "Another description"
        third = await rig.turn("hi", capabilities=parse(changed))
    assert first.status == again.status == third.status == "succeeded", first.failure
    dumps = rig.dumps()
    env = dumps[0]["env"]
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    assert set(config["mcp"]) == {"notes", "github"}
    (old_dir,) = config["skills"]["paths"]
    (skills_dir,) = json.loads(dumps[2]["env"]["OPENCODE_CONFIG_CONTENT"])["skills"]["paths"]
    skill = (Path(skills_dir) / "release-notes" / "SKILL.md").read_text()
    assert "Another description" in skill and not Path(old_dir).exists()
    # The secret header stays with the gateway; the engine has the placeholder.
    assert HEADER_SECRET not in json.dumps(env)
    assert config["mcp"]["github"]["headers"][GATEWAY_HEADER].startswith("crew-gw-")
    # The same capabilities: the same environment (a warm server is kept); another
    # skill: another one (its warm server is started afresh, the session goes on).
    assert env_key(dumps[1]["env"]) == env_key(env)
    assert env_key(dumps[2]["env"]) != env_key(env)
    # No file holds a secret, but the fake opencode's own dump of its environment.
    leaks = []
    for dirpath, _, names in os.walk(rig.crew_home):
        if ".fake-opencode" in Path(dirpath).parts:
            continue
        for name in names:
            data = (Path(dirpath) / name).read_bytes()
            if LOCAL_SECRET.encode() in data or b"sekrit-header-6262" in data:
                leaks.append(str(Path(dirpath) / name))
    assert leaks == []
