"""Markdown in a real browser (Debian's chromium through Playwright) on a real crew-server
(no Computer needed: the person posts, and the page renders what was posted).

- Hostile Markdown runs nothing: no script flag set, no dialog, no `img` in the message,
  no request to any origin but the server's; and the harmless parts render (a code
  block, a list, a link with `rel="noopener noreferrer"`, inline code, a table).
- A message's actions ("Make a task") stay out of sight until the message is hovered or
  holds the focus; axe-core finds nothing serious on the page.
- A sign-in link opened in a tab already on /login signs in (issue 25's small items).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from crew_testkit.crew_server_proc import CrewServer, start_crew_server
from tests.web.pages import DESKTOP, LIVE_TIMEOUT_MS, serious_violations, shoot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

HOSTILE_MARKDOWN = """MD-1 **Build** done, run `make test`:

```sh
echo '<script>window.__pwned = 1</script>'
```

- first <script>window.__pwned = 2</script>
- second <img src=x onerror="window.__pwned = 3">

[the docs](https://docs.example/guide) · [js](javascript:window.__pwned=4) ·
[data](data:text/html,<script>window.__pwned=5</script>) · [vb][r] ·
<a href="javascript:window.__pwned=6">raw link</a> · ![pixel](https://evil.example/p.png)
![inline](data:image/svg+xml,<svg onload="window.__pwned=7">)

| tool | result |
|------|--------|
| <img src=y onerror="window.__pwned=8"> | <b onmouseover="window.__pwned=9">ok</b> |

<details open><summary>raw</summary><iframe src="https://evil.example/"></iframe></details>

[r]: vbscript:msgbox(1)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrewServer]:
    with start_crew_server(tmp_path_factory.mktemp("crew-server")) as started:
        yield started


@pytest.fixture
def page(browser: Any, server: CrewServer) -> Iterator[Any]:
    """A signed-in desktop page that records dialogs and every request's origin."""
    context = browser.new_context(viewport=DESKTOP)
    opened = context.new_page()
    opened.dialogs = []
    opened.origins = set()
    opened.on("dialog", lambda dialog: (opened.dialogs.append(dialog.message), dialog.dismiss()))
    opened.on("request", lambda request: opened.origins.add(origin_of(request.url)))
    sign_in(opened, server.url, server.user_token)
    yield opened
    context.close()


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


# The form holding the button: opacity is not inherited, so that is what fades.
ACTION = "#timeline article .message-actions form"


def shown_as(page: Any, selector: str, opacity: str) -> None:
    """Wait until the element's computed opacity is `opacity` (past the CSS transition)."""
    page.wait_for_function(
        "([selector, opacity]) => {"
        " const found = document.querySelector(selector);"
        " return found !== null && getComputedStyle(found).opacity === opacity; }",
        arg=[selector, opacity],
        timeout=LIVE_TIMEOUT_MS,
    )


def dm_with_a_new_agent(server: CrewServer, handle: str) -> dict[str, Any]:
    client = server.client()
    agent = client.post(
        "/api/agents", json={"handle": handle, "name": handle.title(), "model": "local/x"}
    )
    assert agent.status_code == 201, agent.text
    room = client.post("/api/rooms", json={"kind": "dm", "agent_ids": [agent.json()["id"]]})
    assert room.status_code == 201, room.text
    answer: dict[str, Any] = room.json()
    return answer


def test_hostile_markdown_runs_nothing_and_the_rest_renders(
    page: Any, server: CrewServer, axe_source: str, shots: Path
) -> None:
    room = dm_with_a_new_agent(server, "mark")
    posted = server.client().post(
        f"/api/rooms/{room['id']}/messages", json={"body": HOSTILE_MARKDOWN}
    )
    assert posted.status_code == 201, posted.text
    page.goto(f"{server.url}/rooms/{room['id']}")
    message = page.locator("#timeline article", has_text="MD-1")
    message.wait_for(timeout=LIVE_TIMEOUT_MS)
    body = message.locator(".body")

    # What is harmless renders.
    assert body.locator("strong").first.inner_text() == "Build"
    assert body.locator("p code").first.inner_text() == "make test"
    assert "echo '<script>window.__pwned = 1</script>'" in body.locator("pre code").inner_text()
    assert body.locator("ul > li").count() == 2
    docs = body.get_by_role("link", name="the docs")
    assert docs.get_attribute("href") == "https://docs.example/guide"
    assert docs.get_attribute("rel") == "noopener noreferrer"
    assert body.locator(".md-table table td").count() == 2
    # What is hostile is text, or gone.
    assert (
        body.locator("img, script, iframe, svg, details, b, [onerror], [onmouseover]").count() == 0
    )
    hrefs = body.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert all(h is None or h.startswith("https://") for h in hrefs), hrefs
    assert "<script>window.__pwned = 2</script>" in body.locator("ul > li").first.inner_text()
    body.locator("td").first.hover()
    assert page.evaluate("() => window.__pwned") is None
    assert page.dialogs == []
    assert page.origins == {server.url}, page.origins  # nothing fetched from elsewhere
    assert serious_violations(page, axe_source) == []
    shoot(page, shots, "room-markdown")


def test_a_messages_actions_show_on_hover_and_focus(page: Any, server: CrewServer) -> None:
    room = dm_with_a_new_agent(server, "quiet")
    posted = server.client().post(f"/api/rooms/{room['id']}/messages", json={"body": "QUIET-1"})
    assert posted.status_code == 201, posted.text
    page.goto(f"{server.url}/rooms/{room['id']}")
    message = page.locator("#timeline article", has_text="QUIET-1")
    button = message.get_by_role("button", name="Make message 1 a task")
    page.mouse.move(0, 0)
    shown_as(page, ACTION, "0")
    message.hover()
    shown_as(page, ACTION, "1")
    page.mouse.move(0, 0)
    button.focus()  # the keyboard reaches it as well
    shown_as(page, ACTION, "1")
    button.click()
    page.wait_for_url(f"**/rooms/{room['id']}")
    assert "Task #1" in message.inner_text()


def test_a_sign_in_link_in_a_tab_already_on_the_login_page_signs_in(
    browser: Any, server: CrewServer
) -> None:
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        page.goto(f"{server.url}/login")
        minted = server.client().post("/api/sign-in-codes")
        assert minted.status_code == 201, minted.text
        # Only the fragment differs: the browser does not load the page again by itself.
        page.goto(server.url + minted.json()["path"])
        page.wait_for_url("**/rooms", timeout=LIVE_TIMEOUT_MS)
        assert "#code" not in page.url
    finally:
        context.close()
