"""The sign-in link and the live stream in a real browser (Debian's chromium through
Playwright, with a profile on disk) on a real crew-server (no Computer needed).

- A sign-in link leaves nothing usable in the browser's profile: the user token is in
  none of its files (History, the ukm database, …), and the one-time code its history
  kept signs nobody in (issue 20, item 15).
- Eight tabs of one room all load and all get a new message live: the tabs share one
  stream, so the six connections a browser allows a host are not used up (item 15).
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crew_testkit.crew_server_proc import CrewServer, start_crew_server
from tests.web.conftest import Chromium
from tests.web.pages import LIVE_TIMEOUT_MS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
TABS = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrewServer]:
    with start_crew_server(tmp_path_factory.mktemp("crew-server")) as started:
        yield started


def history_urls(profile: Path, scratch: Path) -> list[str]:
    """The URLs in the profile's History database (a copy: chromium may hold a lock)."""
    copy = scratch / "History"
    shutil.copy(profile / "Default" / "History", copy)
    with sqlite3.connect(copy) as db:
        return [row[0] for row in db.execute("SELECT url FROM urls")]


def files_holding(profile: Path, secret: str) -> list[str]:
    """The profile's files that contain `secret` (as text, or URL-escaped: same here)."""
    needle = secret.encode()
    return sorted(
        str(path.relative_to(profile))
        for path in profile.rglob("*")
        if path.is_file() and not path.is_symlink() and needle in path.read_bytes()
    )


def test_a_sign_in_link_leaves_nothing_usable_in_the_browser_profile(
    chromium: Chromium, server: CrewServer, tmp_path: Path
) -> None:
    minted = server.client().post("/api/sign-in-codes")
    assert minted.status_code == 201, minted.text
    link, code = server.url + minted.json()["path"], minted.json()["code"]
    assert server.user_token not in link
    profile = tmp_path / "profile"
    context = chromium.persistent(profile)
    try:
        page = context.new_page()
        page.goto(link)
        page.wait_for_url("**/rooms")
        assert "#code" not in page.url
        page.goto(f"{server.url}/agents")  # signed in: the cookie works
        page.wait_for_url("**/agents")
    finally:
        context.close()  # chromium writes its databases out

    urls = history_urls(profile, tmp_path)
    assert f"{server.url}/rooms" in urls, urls  # the history was kept (the check sees it)
    assert files_holding(profile, server.user_token) == []
    # Whatever kept the link (History, ukm) kept a spent code: it signs nobody in.
    with httpx.Client(base_url=server.url, timeout=10) as other:
        form = other.get("/login")
        sign_in = form.text.split('name="sign_in" value="', 1)[1].split('"', 1)[0]
        answer = other.post("/login", data={"sign_in": sign_in, "code": code})
    assert answer.status_code == 401 and "used already" in answer.text
    assert "crew_session" not in answer.headers.get("set-cookie", "")


def test_eight_tabs_of_a_room_load_and_get_a_message_live(
    chromium: Chromium, server: CrewServer, tmp_path: Path
) -> None:
    agent = server.create_agent("tabs")
    room = server.create_room("dm", [agent["id"]])
    context = chromium.persistent(tmp_path / "profile")
    try:
        tabs = []
        for _ in range(TABS):
            tab = context.new_page()
            sign_in_once(tab, server)
            # Each page must load while the others hold their live updates open.
            tab.goto(f"{server.url}/rooms/{room['id']}", timeout=30_000)
            tab.locator("#timeline").wait_for()
            tabs.append(tab)
        server.post(room["id"], "LIVE-TO-EIGHT-TABS")
        for number, tab in enumerate(tabs, 1):
            message = tab.locator("#timeline article", has_text="LIVE-TO-EIGHT-TABS")
            message.wait_for(timeout=LIVE_TIMEOUT_MS)
            assert message.count() == 1, f"tab {number} shows the message {message.count()} times"
    finally:
        context.close()


def sign_in_once(tab: Any, server: CrewServer) -> None:
    """The first tab signs in with the token; the others share its cookie."""
    tab.goto(f"{server.url}/rooms")
    if "/login" in tab.url:
        tab.get_by_label("User token", exact=True).fill(server.user_token)
        tab.get_by_role("button", name="Sign in").click()
        tab.wait_for_url("**/rooms")


def test_a_browser_without_shared_worker_still_gets_messages_live(
    chromium: Chromium, server: CrewServer, tmp_path: Path
) -> None:
    agent = server.create_agent("solo")
    room = server.create_room("dm", [agent["id"]])
    context = chromium.persistent(tmp_path / "profile")
    try:
        # As in a browser that has none (the page then holds the stream itself).
        context.add_init_script("delete window.SharedWorker;")
        tab = context.new_page()
        sign_in_once(tab, server)
        tab.goto(f"{server.url}/rooms/{room['id']}")
        assert tab.evaluate("() => typeof SharedWorker") == "undefined"
        server.post(room["id"], "LIVE-WITHOUT-WORKER")
        tab.locator("#timeline article", has_text="LIVE-WITHOUT-WORKER").wait_for(
            timeout=LIVE_TIMEOUT_MS
        )
    finally:
        context.close()
