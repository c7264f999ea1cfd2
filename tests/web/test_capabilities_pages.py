"""The web app's side of issue 27: an agent's MCP servers and skills on its page, edited
through a form (a JSON text box for the servers, fields per skill), secrets shown only as
"(set)", a refusal shown with its reason and the form kept as it was typed."""

from __future__ import annotations

import html
from typing import Any

import orjson
import pytest

from tests.web.site import Site

pytestmark = pytest.mark.anyio

SERVERS = [
    {
        "type": "local",
        "name": "notes",
        "command": ["python3", "notes.py"],
        "secret_environment": {"NOTES_TOKEN": "tok-web-secret"},
    }
]


def form(csrf: str, **fields: Any) -> dict[str, Any]:
    return {"csrf": csrf, "mcp_servers": "", **fields}


async def synced(site: Site, agent_id: str) -> dict[str, Any]:
    """The document its Computer would get (secrets in clear)."""
    computer_id = site.store.get_agent(agent_id)["computer_id"]
    agents = site.store.computer_agents(computer_id)
    return dict(next(a for a in agents if a["id"] == agent_id)["capabilities"])


async def test_the_form_saves_servers_and_skills_and_never_shows_a_secret(site: Site) -> None:
    csrf = await site.sign_in()
    computer_id, _ = site.store.create_computer("box")
    dora = await site.agent("dora", computer_id)
    page = (await site.browser.get(f"/agents/{dora['id']}")).text
    assert "Tools of its own: MCP servers and skills" in page
    assert 'name="mcp_servers"' in page and "A new skill" in page

    saved = await site.browser.post(
        f"/agents/{dora['id']}/capabilities",
        data=form(
            csrf,
            mcp_servers=orjson.dumps(SERVERS).decode(),
            skill_name="release-notes",
            skill_description="How we write release notes",
            skill_body="# Notes\r\nOne line per change.",
            skill_files='{"templates/a.md": "## v"}',
        ),
    )
    assert saved.status_code == 303, saved.text
    assert saved.headers["location"].startswith(f"/agents/{dora['id']}")
    document = await synced(site, dora["id"])
    assert document["mcp_servers"][0]["secret_environment"] == {"NOTES_TOKEN": "tok-web-secret"}
    assert document["skills"] == [
        {
            "name": "release-notes",
            "description": "How we write release notes",
            "body": "# Notes\nOne line per change.",
            "files": {"templates/a.md": "## v"},
        }
    ]

    page = html.unescape((await site.browser.get(f"/agents/{dora['id']}")).text)
    assert "tok-web-secret" not in page
    assert '"NOTES_TOKEN": "(set)"' in page
    assert 'value="release-notes"' in page and "Skill release-notes" in page
    assert "A new skill" in page  # one blank skill to add another

    # The page sent back as it shows: the secret is kept; the skill cleared: removed.
    shown = page.split('name="mcp_servers"', 1)[1].split(">", 1)[1].split("</textarea>", 1)[0]
    again = await site.browser.post(
        f"/agents/{dora['id']}/capabilities",
        data=form(csrf, mcp_servers=shown, skill_name="", skill_description="", skill_body=""),
    )
    assert again.status_code == 303, again.text
    document = await synced(site, dora["id"])
    assert document["mcp_servers"][0]["secret_environment"] == {"NOTES_TOKEN": "tok-web-secret"}
    assert document["skills"] == []


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"mcp_servers": "[{oops"}, "MCP servers is not JSON"),
        (
            {"mcp_servers": '[{"type": "local", "name": "n", "command": "python3 x.py"}]'},
            "mcp_servers.0.command: Input should be a valid list",
        ),
        (
            {"skill_name": "Release Notes", "skill_description": "d", "skill_body": "b"},
            "skills.0.name: 'Release Notes' is not a valid name",
        ),
        (
            {"skill_name": "a", "skill_description": "d", "skill_files": '{"../x": "y"}'},
            "must be relative",
        ),
        ({"skill_name": "a", "skill_description": "d", "skill_files": "[1"}, "skill 1's files"),
    ],
)
async def test_a_refusal_comes_back_with_the_reason_and_what_was_typed(
    site: Site, fields: dict[str, str], reason: str
) -> None:
    csrf = await site.sign_in()
    dora = await site.agent("dora")
    refused = await site.browser.post(
        f"/agents/{dora['id']}/capabilities", data=form(csrf, **fields)
    )
    assert refused.status_code == 422, refused.text
    page = html.unescape(refused.text)
    assert 'id="capabilities-error"' in page and "Not saved: the capabilities are invalid" in page
    assert reason in page
    for value in fields.values():
        assert value.replace("\r\n", "\n") in page, value
    # the page's other forms still come back to the agent page
    assert f'name="back" value="/agents/{dora["id"]}"' in page
    assert site.store.agent_capabilities(dora["id"]) == {"mcp_servers": [], "skills": []}


async def test_without_the_csrf_token_nothing_changes(site: Site) -> None:
    await site.sign_in()
    dora = await site.agent("dora")
    refused = await site.browser.post(
        f"/agents/{dora['id']}/capabilities",
        data={"mcp_servers": orjson.dumps(SERVERS).decode()},
    )
    assert refused.status_code == 403
    assert site.store.agent_capabilities(dora["id"]) == {"mcp_servers": [], "skills": []}


async def test_the_page_shows_what_its_computer_reported_of_each_server(site: Site) -> None:
    await site.sign_in()
    computer_id, _ = site.store.create_computer("box")
    site.store.connect(computer_id, "h", "linux", "1", 2)
    dora = await site.agent("dora", computer_id)
    site.store.set_capabilities(dora["id"], {"mcp_servers": SERVERS})
    page = (await site.browser.get(f"/agents/{dora['id']}")).text
    assert 'id="mcp-states"' not in page  # nothing reported yet

    version = site.store.computer_agents(computer_id)[0]["capabilities_version"]
    failed = {"name": "notes", "state": "failed", "reason": "python3: not found in the sandbox"}
    site.store.set_capabilities_state(computer_id, dora["id"], version, [failed])
    page = html.unescape((await site.browser.get(f"/agents/{dora['id']}")).text)
    assert '<strong class="mcp-failed">failed</strong> · python3: not found in the sandbox' in page
    assert "As its Computer reported" in page

    site.store.set_capabilities(dora["id"], {})
    page = html.unescape((await site.browser.get(f"/agents/{dora['id']}")).text)
    assert "has not applied the latest ones yet" in page
