"""Renaming a group, changing its agents and deleting it through the confirmation page, in
Debian's chromium with JavaScript off (the forms work without it), on a real crew-server
(no Computer needed); the room's settings and the confirmation page pass axe at both
widths (issue 25)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crew_testkit.crew_server_proc import CrewServer, start_crew_server
from tests.web.pages import DESKTOP, PHONE, serious_violations, shoot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrewServer]:
    with start_crew_server(tmp_path_factory.mktemp("crew-server")) as started:
        yield started


def make(server: CrewServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = server.client().post(path, json=body)
    assert answer.status_code == 201, answer.text
    made: dict[str, Any] = answer.json()
    return made


def crew(server: CrewServer, title: str, *handles: str) -> tuple[dict[str, Any], list[str]]:
    """Agents (no Computer) and a group of the first of them, with one message."""
    ids = [
        make(server, "/api/agents", {"handle": h, "name": h.title(), "model": "local/x"})["id"]
        for h in handles
    ]
    group = make(server, "/api/rooms", {"kind": "group", "title": title, "agent_ids": ids[:1]})
    make(server, f"/api/rooms/{group['id']}/messages", {"body": "hello"})
    return group, ids


def test_rename_change_agents_and_delete_a_group_without_javascript(
    browser: Any, server: CrewServer, shots: Path
) -> None:
    group, (ada, bob) = crew(server, "Crew", "ada", "bob")
    context = browser.new_context(viewport=DESKTOP, java_script_enabled=False)
    page = context.new_page()
    sign_in(page, server.url, server.user_token)
    page.goto(f"{server.url}/rooms/{group['id']}")

    settings = page.get_by_role("complementary").locator(".room-settings")
    settings.get_by_label("Name").fill("Ship it")
    settings.get_by_role("button", name="Rename the group").click()
    page.wait_for_url(f"**/rooms/{group['id']}")
    assert page.locator("#room-title").inner_text().startswith("Ship it")

    settings.get_by_label("Ada (@ada)").uncheck()
    settings.get_by_label("Bob (@bob)").check()
    settings.get_by_role("button", name="Save the agents").click()
    page.wait_for_url(f"**/rooms/{group['id']}")
    assert page.locator("ul.members li").all_inner_texts()[0].startswith("Bob @bob")
    room = server.client().get(f"/api/rooms/{group['id']}").json()
    assert [m["handle"] for m in room["members"][1:]] == ["bob"]

    page.get_by_role("link", name="Delete this room").click()
    page.wait_for_url(f"**/rooms/{group['id']}/delete")
    assert page.get_by_role("heading", level=1).inner_text() == "Delete the group Ship it?"
    assert "Its 1 message, 0 threads and 0 tasks go." in page.locator("main").inner_text()
    shoot(page, shots, "confirm-delete-room")
    page.get_by_role("link", name="Cancel").click()
    page.wait_for_url(f"**/rooms/{group['id']}")
    assert server.client().get(f"/api/rooms/{group['id']}").status_code == 200

    page.get_by_role("link", name="Delete this room").click()
    page.get_by_role("button", name="Delete the room").click()
    page.wait_for_url("**/rooms")
    assert "Ship it was deleted." in page.get_by_role("alert").inner_text()
    assert server.client().get(f"/api/rooms/{group['id']}").status_code == 404
    agents = [a["id"] for a in server.client().get("/api/agents").json()]
    assert {ada, bob} <= set(agents)
    context.close()


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["360px", "desktop"])
def test_the_settings_and_the_confirmation_pass_axe(
    browser: Any, server: CrewServer, shots: Path, axe_source: str, viewport: dict[str, int]
) -> None:
    width = viewport["width"]
    group, (cy,) = crew(server, f"Axe {width}", f"cy{width}")
    context = browser.new_context(viewport=viewport)
    page = context.new_page()
    sign_in(page, server.url, server.user_token)
    found = {}
    pages = {
        "room-settings": f"/rooms/{group['id']}",
        "confirm-room": f"/rooms/{group['id']}/delete",
        "confirm-agent": f"/agents/{cy}/delete",
    }
    for name, path in pages.items():
        page.goto(f"{server.url}{path}")
        found[path] = serious_violations(page, axe_source)
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width, path
        shoot(page, shots, f"{name}-{width}")
    context.close()
    assert {p: v for p, v in found.items() if v} == {}
