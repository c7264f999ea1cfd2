"""An agent's MCP servers and skills edited on its page in Debian's chromium, on a real
crew-server (no Computer needed): a refusal shows its reason and keeps what was typed, a
saved secret reads "(set)", and the page passes axe at both widths (issue 27)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crew_testkit.crew_server_proc import CrewServer, start_crew_server
from tests.web.pages import DESKTOP, PHONE, serious_violations, shoot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SERVERS = (
    '[{"type": "remote", "name": "github", "url": "https://mcp.example.com/v1", '
    '"secret_headers": {"Authorization": "Bearer tok-browser-secret"}}]'
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrewServer]:
    with start_crew_server(tmp_path_factory.mktemp("crew-server")) as started:
        yield started


def agent(server: CrewServer, handle: str) -> str:
    answer = server.client().post(
        "/api/agents", json={"handle": handle, "name": handle.title(), "model": "local/x"}
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def test_edit_servers_and_a_skill_with_a_refusal_first(
    browser: Any, server: CrewServer, shots: Path
) -> None:
    ada = agent(server, "ada")
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    sign_in(page, server.url, server.user_token)
    page.goto(f"{server.url}/agents/{ada}")

    page.get_by_label("MCP servers, a JSON list (blank: none)").fill(SERVERS)
    page.locator("#skill-1-name").fill("Release Notes")
    page.locator("#skill-1-description").fill("How we write release notes")
    page.get_by_label("Instructions (Markdown)").fill("# Notes\nOne line per change.")
    page.get_by_role("button", name="Save its tools").click()
    page.wait_for_load_state()
    error = page.locator("#capabilities-error")
    assert "skills.0.name: 'Release Notes' is not a valid name" in error.inner_text()
    assert error.get_attribute("role") == "alert"
    # what was typed is still there, to be corrected
    assert page.locator("#skill-1-name").input_value() == "Release Notes"
    assert "tok-browser-secret" in page.locator("#capabilities-mcp").input_value()
    shoot(page, shots, "agent-capabilities-refused")

    page.locator("#skill-1-name").fill("release-notes")
    page.get_by_role("button", name="Save its tools").click()
    page.wait_for_url(f"**/agents/{ada}*")
    assert page.locator("#capabilities-error").count() == 0
    shown = page.locator("#capabilities-mcp").input_value()
    assert '"Authorization": "(set)"' in shown and "tok-browser-secret" not in page.content()
    assert page.locator("#skill-1-name").input_value() == "release-notes"
    assert page.get_by_role("group", name="A new skill").count() == 1
    stored = server.client().get(f"/api/agents/{ada}/capabilities").json()
    assert [s["name"] for s in stored["skills"]] == ["release-notes"]
    assert stored["skills"][0]["body"] == "# Notes\nOne line per change."
    shoot(page, shots, "agent-capabilities")
    # The section alone (docs/web/agent-capabilities.png is this one).
    page.locator("#agent-capabilities").screenshot(
        path=str(shots / "agent-capabilities-section.png")
    )
    context.close()


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["360px", "desktop"])
def test_the_agent_page_with_its_tools_passes_axe(
    browser: Any, server: CrewServer, axe_source: str, viewport: dict[str, int]
) -> None:
    width = viewport["width"]
    bo = agent(server, f"bo{width}")
    put = server.client().put(
        f"/api/agents/{bo}/capabilities",
        json={"skills": [{"name": "notes", "description": "d", "body": "b"}]},
    )
    assert put.status_code == 200, put.text
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    sign_in(page, server.url, server.user_token)
    page.goto(f"{server.url}/agents/{bo}")
    assert serious_violations(page, axe_source) == []
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width
    # refused: the error state passes too
    page.get_by_label("MCP servers, a JSON list (blank: none)").fill("[{oops")
    page.get_by_role("button", name="Save its tools").click()
    page.wait_for_load_state()
    assert "MCP servers is not JSON" in page.locator("#capabilities-error").inner_text()
    assert serious_violations(page, axe_source) == []
    context.close()
