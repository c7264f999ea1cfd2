"""Issue 27 on the server: each agent's capabilities (MCP servers and skills) stored with
it, checked by `crew_common.capabilities`, never shown back with their secrets, given to
its Computer with them and a version; on both stores."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest

from crew_common import capabilities as caps
from tests.server.world import Computer, World

pytestmark = pytest.mark.anyio

NONE = {"mcp_servers": [], "skills": []}
LOCAL = {
    "type": "local",
    "name": "notes",
    "command": ["python3", "-m", "notes_mcp"],
    "environment": {"NOTES_DIR": "notes"},
    "secret_environment": {"NOTES_TOKEN": "tok-local-1"},
}
REMOTE = {
    "type": "remote",
    "name": "github",
    "url": "https://mcp.example.com/v1",
    "headers": {"X-Org": "acme"},
    "secret_headers": {"Authorization": "Bearer tok-remote-1"},
    "timeout_ms": 5000,
}
SKILL = {
    "name": "release-notes",
    "description": "How we write release notes",
    "body": "# Release notes\nOne line per change.",
    "files": {"templates/notes.md": "## {version}"},
}
DOC = {"mcp_servers": [LOCAL, REMOTE], "skills": [SKILL]}


def agent_body(handle: str, box: Computer, **more: Any) -> dict[str, Any]:
    return {"handle": handle, "name": handle.title(), "model": "m/x", "computer_id": box.id, **more}


async def computer_agent(world: World, box: Computer, agent_id: str) -> dict[str, Any]:
    agents = await world.ok("GET", "/computer/agents", headers=box.headers)
    return dict(next(a for a in agents if a["id"] == agent_id))


def normal(document: dict[str, Any]) -> dict[str, Any]:
    """`document` with the defaults the server fills in."""
    servers = []
    for server in document["mcp_servers"]:
        plain, secret = ("environment", "secret_environment")
        if server["type"] == "remote":
            plain, secret = ("headers", "secret_headers")
        servers.append({plain: {}, secret: {}, "enabled": True, "timeout_ms": None, **server})
    skills = [{"files": {}, **skill} for skill in document["skills"]]
    return {"mcp_servers": servers, "skills": skills}


def shown(document: dict[str, Any]) -> dict[str, Any]:
    """What the user sees of a normalised document: secrets as "(set)"."""
    out = orjson.loads(orjson.dumps(document))
    for server in out["mcp_servers"]:
        for name in ("secret_environment", "secret_headers"):
            if name in server:
                server[name] = dict.fromkeys(server[name], "(set)")
    return out


async def test_an_agent_has_none_by_default_and_its_computer_gets_an_empty_version(
    world: World,
) -> None:
    box = await world.computer()
    made = await world.agent("alice", box)
    assert await world.ok("GET", f"/api/agents/{made['id']}/capabilities") == NONE
    synced = await computer_agent(world, box, made["id"])
    assert synced["capabilities"] == NONE
    expected = hashlib.sha256(b'{"mcp_servers":[],"skills":[]}').hexdigest()
    assert synced["capabilities_version"] == expected
    # the user's agent records do not carry them
    assert "capabilities" not in made
    assert all("capabilities" not in a for a in await world.ok("GET", "/api/agents"))


async def test_given_at_creation_the_computer_gets_the_secrets_and_the_user_never(
    world: World,
) -> None:
    box = await world.computer()
    before = world.cursor()
    made = await world.ok(
        "POST", "/api/agents", json=agent_body("alice", box, capabilities=DOC), status=201
    )
    assert world.events(box, before) == [("agents", {"agent_id": made["id"]})]
    seen = await world.ok("GET", f"/api/agents/{made['id']}/capabilities")
    assert seen == shown(normal(DOC))
    assert seen["mcp_servers"][0]["secret_environment"] == {"NOTES_TOKEN": "(set)"}
    assert seen["mcp_servers"][1]["secret_headers"] == {"Authorization": "(set)"}
    # No secret value anywhere the user reads about the agent.
    for path in ("/api/agents", f"/api/agents/{made['id']}/capabilities"):
        text = (await world.client.get(path)).text
        assert "tok-local-1" not in text and "tok-remote-1" not in text, path

    synced = await computer_agent(world, box, made["id"])
    assert synced["capabilities"] == normal(DOC)
    assert synced["capabilities_version"] == caps.version(normal(DOC))
    assert synced["capabilities_version"] == hashlib.sha256(caps.canonical(normal(DOC))).hexdigest()


async def test_a_put_replaces_them_keeps_set_secrets_and_tells_the_computer(
    world: World,
) -> None:
    box = await world.computer()
    alice = await world.ok(
        "POST", "/api/agents", json=agent_body("alice", box, capabilities=DOC), status=201
    )
    path = f"/api/agents/{alice['id']}/capabilities"
    first = (await computer_agent(world, box, alice["id"]))["capabilities_version"]

    # What GET answered, sent back as it is: nothing changes, nobody is told.
    before = world.cursor()
    same = await world.ok("PUT", path, json=await world.ok("GET", path))
    assert same == shown(normal(DOC))
    assert world.events(box, before) == []
    assert (await computer_agent(world, box, alice["id"]))["capabilities"] == normal(DOC)

    # A new secret value and a dropped skill: a new version, the Computer hears it.
    edited = shown(normal(DOC))
    edited["mcp_servers"][1]["secret_headers"] = {"Authorization": "Bearer tok-remote-2"}
    edited["skills"] = []
    await world.ok("PUT", path, json=edited)
    assert world.events(box, before) == [("agents", {"agent_id": alice["id"]})]
    synced = await computer_agent(world, box, alice["id"])
    assert synced["capabilities_version"] != first
    assert synced["capabilities"]["skills"] == []
    assert synced["capabilities"]["mcp_servers"][0]["secret_environment"] == {
        "NOTES_TOKEN": "tok-local-1"
    }
    assert synced["capabilities"]["mcp_servers"][1]["secret_headers"] == {
        "Authorization": "Bearer tok-remote-2"
    }

    # Empty again.
    assert await world.ok("PUT", path, json={}) == NONE
    assert (await computer_agent(world, box, alice["id"]))["capabilities"] == NONE


async def test_set_for_a_secret_nothing_stored_is_refused(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    renamed = {**LOCAL, "secret_environment": {"NOTES_TOKEN": "(set)"}}
    refused = await world.client.put(
        f"/api/agents/{alice['id']}/capabilities", json={"mcp_servers": [renamed]}
    )
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_capabilities"
    assert "NOTES_TOKEN" in error["message"] and "send the value" in error["message"]
    # at creation too: nothing is stored yet
    made = await world.client.post(
        "/api/agents", json=agent_body("bob", box, capabilities={"mcp_servers": [renamed]})
    )
    assert made.status_code == 422 and made.json()["error"]["code"] == "invalid_capabilities"


def with_server(**changes: Any) -> dict[str, Any]:
    return {"mcp_servers": [{**LOCAL, **changes}]}


def with_skill(**changes: Any) -> dict[str, Any]:
    return {"skills": [{**SKILL, **changes}]}


BAD = [
    ({"mcp_servers": [], "tools": []}, "tools: Extra inputs are not permitted"),
    (with_server(shell=True), "mcp_servers.0.shell: Extra inputs are not permitted"),
    (with_server(name="Notes"), "mcp_servers.0.name: 'Notes' is not a valid name"),
    (with_server(name="my_notes"), "mcp_servers.0.name: 'my_notes' is not a valid name"),
    (
        with_server(command="python3 -m notes"),
        "mcp_servers.0.command: Input should be a valid list",
    ),
    (with_server(command=[]), "mcp_servers.0.command: List should have at least 1 item"),
    (with_server(type="docker"), "mcp_servers.0: Input tag 'docker' found using 'type'"),
    (with_server(environment={"BAD-NAME": "x"}), "'BAD-NAME' is not a valid environment"),
    (
        with_server(environment={"NOTES_TOKEN": "x"}),
        "NOTES_TOKEN is in both environment and secret_environment",
    ),
    (with_server(timeout_ms=0), "mcp_servers.0.timeout_ms: Input should be greater than"),
    ({"mcp_servers": [LOCAL, {**REMOTE, "name": "notes"}]}, "two MCP servers are named 'notes'"),
    (
        {"mcp_servers": [{**REMOTE, "url": "file:///etc/passwd"}]},
        "the url must start with http:// or https://",
    ),
    ({"mcp_servers": [{**REMOTE, "url": "https://"}]}, "the url has no host"),
    (
        {"mcp_servers": [{**REMOTE, "headers": {"X-A": "a\r\nInjected: 1"}}]},
        "contains a line break",
    ),
    (with_skill(name="Release Notes"), "skills.0.name: 'Release Notes' is not a valid name"),
    (with_skill(description=" "), "skills.0.description: the description is blank"),
    (with_skill(files={"../escape.md": "x"}), "must be relative"),
    (with_skill(files={"/etc/passwd": "x"}), "must be relative"),
    (with_skill(files={"a/./b.md": "x"}), "must be relative"),
    (with_skill(files={"SKILL.md": "x"}), "SKILL.md is written from name"),
    (with_skill(files={"a": "x", "a/b": "y"}), "a is both a file and a directory"),
    (with_skill(body="x" * (64 * 1024 + 1), files={}), "at most 65536"),
    (
        with_skill(body="é" * (32 * 1024), files={"t.md": "x"}),
        "the skill is 65537 bytes (body and files, UTF-8); at most 65536",
    ),
    ({"skills": [SKILL, SKILL]}, "two skills are named 'release-notes'"),
    ({"skills": "none"}, "skills: Input should be a valid list"),
]


@pytest.mark.parametrize(("document", "reason"), BAD, ids=[r for _, r in BAD])
async def test_a_document_it_cannot_take_is_refused_with_the_reason_and_nothing_stored(
    world: World, document: dict[str, Any], reason: str
) -> None:
    box = await world.computer()
    alice = await world.ok(
        "POST", "/api/agents", json=agent_body("alice", box, capabilities=DOC), status=201
    )
    path = f"/api/agents/{alice['id']}/capabilities"
    before = world.cursor()
    refused = await world.client.put(path, json=document)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_capabilities"
    assert reason in error["message"], error["message"]
    assert error["message"].startswith("the capabilities are invalid: ")
    assert world.events(box, before) == []
    assert (await computer_agent(world, box, alice["id"]))["capabilities"] == normal(DOC)
    # the same refusal at creation, and no agent made
    made = await world.client.post(
        "/api/agents", json=agent_body("bob", box, capabilities=document)
    )
    assert made.status_code == 422, made.text
    assert made.json()["error"]["code"] == "invalid_capabilities"
    assert [a["handle"] for a in await world.ok("GET", "/api/agents")] == ["alice"]


async def test_a_body_that_is_not_an_object_is_refused(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    refused = await world.client.put(f"/api/agents/{alice['id']}/capabilities", json=[1])
    assert refused.status_code == 422, refused.text


async def test_the_limit_itself_is_taken(world: World) -> None:
    box = await world.computer()
    alice = await world.agent("alice", box)
    exact = with_skill(body="x" * (64 * 1024 - 2), files={"a.md": "yy"})
    saved = await world.ok("PUT", f"/api/agents/{alice['id']}/capabilities", json=exact)
    assert saved["skills"][0]["files"] == {"a.md": "yy"}


async def test_unknown_agent_and_no_user_token(world: World) -> None:
    missing = "00000000-0000-4000-8000-000000000000"
    got = await world.client.get(f"/api/agents/{missing}/capabilities")
    assert got.status_code == 404
    put = await world.client.put(f"/api/agents/{missing}/capabilities", json={})
    assert put.status_code == 404
    box = await world.computer()
    alice = await world.agent("alice", box)
    anonymous = await world.client.get(
        f"/api/agents/{alice['id']}/capabilities", headers={"authorization": "Bearer nope"}
    )
    assert anonymous.status_code == 401
    # a Computer's token is not the user's
    as_box = await world.client.get(f"/api/agents/{alice['id']}/capabilities", headers=box.headers)
    assert as_box.status_code == 401


async def test_another_computer_never_sees_them(world: World) -> None:
    box, other = await world.computer(), await world.computer()
    await world.ok(
        "POST", "/api/agents", json=agent_body("alice", box, capabilities=DOC), status=201
    )
    text = (await world.client.get("/computer/agents", headers=other.headers)).text
    assert "tok-local-1" not in text and "alice" not in text


async def test_the_computer_reports_each_servers_state_for_a_version(world: World) -> None:
    box = await world.computer()
    alice = await world.ok(
        "POST", "/api/agents", json=agent_body("alice", box, capabilities=DOC), status=201
    )
    path = f"/api/agents/{alice['id']}/capabilities/state"
    nothing = await world.ok("GET", path)
    assert nothing == {
        "current": False,
        "reported_at": None,
        "capabilities_version": None,
        "mcp_servers": [],
    }
    version = (await computer_agent(world, box, alice["id"]))["capabilities_version"]
    servers = [
        {"name": "notes", "state": "connected", "reason": None},
        {"name": "github", "state": "failed", "reason": "no handshake within 5 s"},
    ]
    report = {"capabilities_version": version, "mcp_servers": servers}
    state_path = f"/computer/agents/{alice['id']}/capabilities/state"
    await world.ok("PUT", state_path, json=report, headers=box.headers, status=204)
    seen = await world.ok("GET", path)
    assert seen["current"] is True and seen["mcp_servers"] == servers
    assert seen["capabilities_version"] == version and seen["reported_at"]

    # A change the Computer has not applied yet: the old report is no longer current.
    await world.ok("PUT", f"/api/agents/{alice['id']}/capabilities", json={})
    assert (await world.ok("GET", path))["current"] is False

    # Another Computer cannot report for it; a bad state is refused.
    other = await world.computer()
    refused = await world.client.put(state_path, json=report, headers=other.headers)
    assert refused.status_code == 404
    bad = {"capabilities_version": version, "mcp_servers": [{"name": "x", "state": "fine"}]}
    refused = await world.client.put(state_path, json=bad, headers=box.headers)
    assert refused.status_code == 422


# ---------------------------------------------------------------- the pure parts


def test_the_version_is_of_the_normalised_document_whatever_the_key_order() -> None:
    one = caps.normalised({"skills": [SKILL], "mcp_servers": [LOCAL]})
    reordered = {"mcp_servers": [dict(reversed(list(LOCAL.items())))], "skills": [SKILL]}
    two = caps.normalised(reordered)
    assert caps.version(one) == caps.version(two)
    assert caps.canonical(one) == caps.canonical(two)
    # a secret's value is part of it: a rotated token restarts the server
    rotated = {**LOCAL, "secret_environment": {"NOTES_TOKEN": "tok-local-2"}}
    assert caps.version(caps.normalised({"mcp_servers": [rotated]})) != caps.version(
        caps.normalised({"mcp_servers": [LOCAL]})
    )


def test_redaction_and_kept_secrets_go_by_server_name_and_key() -> None:
    stored = caps.normalised(DOC)
    shown_doc = caps.redacted(stored)
    assert "tok-local-1" not in orjson.dumps(shown_doc).decode()
    assert caps.redacted(stored) != stored and stored["mcp_servers"][0]["secret_environment"]
    assert caps.normalised(caps.with_kept_secrets(shown_doc, stored)) == stored
    # a server renamed: its "(set)" secret has no stored value under the new name
    renamed = orjson.loads(orjson.dumps(shown_doc))
    renamed["mcp_servers"][0]["name"] = "jotter"
    with pytest.raises(caps.CapabilitiesError, match="NOTES_TOKEN of MCP server 'jotter'"):
        caps.with_kept_secrets(renamed, stored)
    # something that is not a document is left for parse to refuse, not a crash
    for odd in (None, [], {"mcp_servers": "x"}, {"mcp_servers": [1, {"secret_headers": 2}]}):
        caps.with_kept_secrets(odd, stored)


async def test_a_patch_of_the_agent_replaces_them_too(world: World) -> None:
    box = await world.computer()
    alice = await world.ok(
        "POST", "/api/agents", json=agent_body("alice", box, capabilities=DOC), status=201
    )
    before = world.cursor()
    kept = shown(normal(DOC))
    kept["skills"] = []
    await world.ok("PATCH", f"/api/agents/{alice['id']}", json={"capabilities": kept})
    assert world.events(box, before) == [("agents", {"agent_id": alice["id"]})]
    synced = (await computer_agent(world, box, alice["id"]))["capabilities"]
    assert synced["skills"] == [] and synced["mcp_servers"] == normal(DOC)["mcp_servers"]
    # null or absent: no change; a bad one: the same refusal as the PUT
    await world.ok("PATCH", f"/api/agents/{alice['id']}", json={"capabilities": None})
    await world.ok("PATCH", f"/api/agents/{alice['id']}", json={"name": "Al"})
    assert (await computer_agent(world, box, alice["id"]))["capabilities"] == synced
    refused = await world.client.patch(
        f"/api/agents/{alice['id']}", json={"capabilities": {"skills": [{"name": "x"}]}}
    )
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "invalid_capabilities"


def test_a_whole_number_written_as_json_float_is_the_integer_and_a_boolean_is_not() -> None:
    """JSON `5000.0` is an integer to JSON Schema, so the schema-valid request is taken
    (schemathesis found it refused); `true` stays refused under strict mode."""
    server = {"type": "local", "name": "notes", "command": ["notes-mcp"]}
    taken = caps.parse({"mcp_servers": [{**server, "timeout_ms": 5000.0}], "skills": []})
    assert taken.mcp_servers[0].timeout_ms == 5000
    assert type(taken.mcp_servers[0].timeout_ms) is int
    for refused in (True, 2.5, "5000"):
        with pytest.raises(caps.CapabilitiesError):
            caps.parse({"mcp_servers": [{**server, "timeout_ms": refused}], "skills": []})
