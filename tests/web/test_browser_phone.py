"""A room on a phone and the optimistic send, in a real browser (Debian's chromium through
Playwright) on a real crew-server (no Computer needed), issue 25:

- At 390×844 with touch, "Reply in thread" opens the thread as its own view (in the
  viewport, the timeline hidden) with a "← Back to the room" link; the composer's hint
  does not offer Ctrl+Enter (it does on a desktop); axe-core finds nothing serious.
- The person's message shows at once as pending, before the server has even received
  the post (the test holds the request), then exactly once when the stream brings it;
  a post that fails leaves the pending one marked failed and the text in the composer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crew_testkit.crew_server_proc import CrewServer, start_crew_server
from tests.web.pages import DESKTOP, LIVE_TIMEOUT_MS, serious_violations, shoot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
PHONE_390 = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrewServer]:
    with start_crew_server(tmp_path_factory.mktemp("crew-server")) as started:
        yield started


@pytest.fixture(scope="module")
def group(server: CrewServer) -> dict[str, Any]:
    """A group of two agents (on no Computer: nobody answers) with a few messages."""
    api = server.client()
    ids = []
    for handle in ("ada", "bob"):
        body = {"handle": handle, "name": handle.title(), "model": "local/scripted"}
        created = api.post("/api/agents", json=body)
        assert created.status_code == 201, created.text
        ids.append(created.json()["id"])
    room = api.post("/api/rooms", json={"kind": "group", "title": "Phones", "agent_ids": ids})
    assert room.status_code == 201, room.text
    for n in range(12):
        api.post(f"/api/rooms/{room.json()['id']}/messages", json={"body": f"earlier {n}"})
    return dict(room.json())


def open_page(browser: Any, server: CrewServer, **options: Any) -> Any:
    context = browser.new_context(**options)
    page = context.new_page()
    sign_in(page, server.url, server.user_token)
    return page


def hint_text(page: Any, field_id: str) -> str:
    """The hint as shown (innerText leaves out what CSS hides)."""
    return str(page.locator(f"#{field_id}-hint").inner_text())


def test_a_thread_is_its_own_view_on_a_phone(
    browser: Any, server: CrewServer, group: dict[str, Any], axe_source: str, shots: Path
) -> None:
    page = open_page(browser, server, viewport=PHONE_390, has_touch=True, is_mobile=True)
    try:
        page.goto(f"{server.url}/rooms/{group['id']}")
        assert not page.evaluate("matchMedia('(hover: hover) and (pointer: fine)').matches")
        assert "Ctrl+Enter" not in hint_text(page, "body")
        assert "tap Send" in hint_text(page, "body")
        assert serious_violations(page, axe_source) == []

        page.get_by_role("link", name="Reply in thread").last.tap()
        page.wait_for_url("**thread=**#thread")
        thread = page.locator("#thread")
        back = page.get_by_role("link", name="← Back to the room")
        page.wait_for_function(
            "document.getElementById('thread').getBoundingClientRect().top < 200"
        )
        assert thread.is_visible() and back.is_visible()
        assert page.evaluate(
            """() => { const r = document.getElementById('thread').getBoundingClientRect();
                       return r.top >= 0 && r.top < innerHeight; }"""
        )
        assert page.locator("#thread-body").is_visible()
        assert page.locator("#timeline").is_hidden()
        assert page.locator("#rooms-nav").is_hidden()
        assert "Ctrl+Enter" not in hint_text(page, "thread-body")
        assert serious_violations(page, axe_source) == []
        shoot(page, shots, "phone-390-thread")

        back.tap()
        page.wait_for_url(f"**/rooms/{group['id']}")
        assert page.locator("#timeline").is_visible()
        assert page.locator("#thread").count() == 0
    finally:
        page.context.close()

    desktop = open_page(browser, server, viewport=DESKTOP)
    try:
        desktop.goto(f"{server.url}/rooms/{group['id']}")
        assert "Ctrl+Enter sends" in hint_text(desktop, "body")
    finally:
        desktop.context.close()


def test_an_own_message_shows_at_once_then_once(
    browser: Any, server: CrewServer, group: dict[str, Any]
) -> None:
    page = open_page(browser, server, viewport=DESKTOP)
    held: list[Any] = []
    try:
        page.goto(f"{server.url}/rooms/{group['id']}")
        page.route("**/rooms/*/messages", lambda route: held.append(route))
        text = "OPTIMISTIC <b>not bold</b>"
        page.get_by_label("Message", exact=True).fill(text)
        page.get_by_role("button", name="Send").first.click()

        pending = page.locator("#timeline .message.pending")
        pending.wait_for(timeout=LIVE_TIMEOUT_MS)
        assert pending.locator(".body").inner_text() == text
        assert pending.locator(".body b").count() == 0  # text, never markup
        # Shown before the server had the post: the browser still holds it.
        page.wait_for_function("() => true")  # let the route handler run
        assert len(held) == 1, held
        bodies = [
            m["body"] for m in server.client().get(f"/api/rooms/{group['id']}/messages").json()
        ]
        assert text not in bodies

        held[0].continue_()
        mine = page.locator("#timeline .message", has_text="OPTIMISTIC")
        page.wait_for_function(
            "() => !document.querySelector('#timeline .message.pending')", timeout=LIVE_TIMEOUT_MS
        )
        assert mine.count() == 1
        assert mine.get_attribute("id", timeout=1000).startswith("m-")
        assert mine.get_attribute("data-client-id")

        page.unroute("**/rooms/*/messages")
        page.route("**/rooms/*/messages", lambda route: route.abort())
        page.get_by_label("Message", exact=True).fill("WILL FAIL")
        page.get_by_role("button", name="Send").first.click()
        failed = page.locator("#timeline .message.failed", has_text="WILL FAIL")
        failed.wait_for(timeout=LIVE_TIMEOUT_MS)
        assert "Not sent" in failed.locator(".state").inner_text()
        assert page.get_by_label("Message", exact=True).input_value() == "WILL FAIL"
        assert page.locator("#timeline .message", has_text="OPTIMISTIC").count() == 1
    finally:
        page.context.close()
