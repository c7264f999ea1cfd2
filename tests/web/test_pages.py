"""The web app in-process (httpx over ASGI): sign-in, CSRF, escaping, paging, the forms.

The browser tests (test_browser.py) show the same through a real Chromium and the
whole chain; these pin the rules quickly and name what broke.
"""

from __future__ import annotations

import re
import time

import httpx
import pytest

from crew_server.api import sign_in
from crew_server.store import USER, AgentIdentity
from tests.web.site import Site, hidden

pytestmark = pytest.mark.anyio

HOSTILE = '<script>alert(1)</script><img src=x onerror="alert(2)">'


async def test_pages_need_a_session(site: Site) -> None:
    for path in ("/", "/rooms", "/agents", "/tasks", "/computers", "/live"):
        answer = await site.browser.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"].startswith("/login?next=")


async def test_sign_in_sets_a_strict_http_only_cookie_and_sign_out_ends_it(site: Site) -> None:
    form = await site.browser.get("/login")
    answer = await site.browser.post(
        "/login", data={"sign_in": hidden(form.text, "sign_in"), "token": site.token}
    )
    cookie = answer.headers["set-cookie"]
    assert "crew_session=" in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    rooms = await site.browser.get("/rooms")
    assert rooms.status_code == 200
    stolen = site.browser.cookies["crew_session"]
    out = await site.browser.post("/logout", data={"csrf": hidden(rooms.text, "csrf")})
    assert out.status_code == 303
    # The old cookie value no longer works, even if a copy survived.
    site.browser.cookies.set("crew_session", stolen)
    again = await site.browser.get("/rooms")
    assert again.status_code == 303


async def test_a_wrong_token_is_refused(site: Site) -> None:
    form = await site.browser.get("/login")
    answer = await site.browser.post(
        "/login", data={"sign_in": hidden(form.text, "sign_in"), "token": "cru_wrong"}
    )
    assert answer.status_code == 401
    assert "not the user token" in answer.text
    assert "crew_session" not in answer.headers.get("set-cookie", "")


async def test_sign_in_without_its_form_token_is_refused(site: Site) -> None:
    answer = await site.browser.post("/login", data={"token": site.token})
    assert answer.status_code == 303
    assert answer.headers["location"].startswith("/login")
    assert "crew_session" not in answer.headers.get("set-cookie", "")


async def test_a_form_post_without_csrf_is_refused_and_changes_nothing(site: Site) -> None:
    csrf = await site.sign_in()
    agent = await site.agent("ada")
    room = (
        await site.api.post("/api/rooms", json={"kind": "dm", "agent_ids": [agent["id"]]})
    ).json()
    for data in ({"body": "no token"}, {"body": "wrong token", "csrf": csrf[:-2] + "xx"}):
        answer = await site.browser.post(f"/rooms/{room['id']}/messages", data=data)
        assert answer.status_code == 403
        assert "CSRF" in answer.text
    assert site.store.list_messages(room["id"], 0, 10) == []
    answer = await site.browser.post(
        f"/rooms/{room['id']}/messages", data={"body": "with token", "csrf": csrf}
    )
    assert answer.status_code == 303
    assert [m["body"] for m in site.store.list_messages(room["id"], 0, 10)] == ["with token"]


async def test_every_page_has_a_strict_csp(site: Site) -> None:
    await site.sign_in()
    answer = await site.browser.get("/rooms")
    csp = answer.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in re.sub(
        r'<script src="/static/[a-z-]+\.js" defer></script>', "", answer.text
    )


async def test_what_agents_write_is_escaped(site: Site) -> None:
    csrf = await site.sign_in()
    agent = await site.agent("eve")
    room = (
        await site.api.post("/api/rooms", json={"kind": "dm", "agent_ids": [agent["id"]]})
    ).json()
    await site.browser.post(
        f"/rooms/{room['id']}/messages", data={"body": HOSTILE + " @eve", "csrf": csrf}
    )
    await site.api.patch(f"/api/agents/{agent['id']}", json={"name": "<b onmouseover=x>Eve</b>"})
    page = (await site.browser.get(f"/rooms/{room['id']}")).text
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b onmouseover" not in page
    assert '<span class="mention">@eve</span>' in page
    roster = (await site.browser.get("/agents")).text
    assert "<b onmouseover" not in roster and "&lt;b onmouseover=x&gt;Eve&lt;/b&gt;" in roster


async def test_a_long_room_opens_with_one_page_and_pages_back(site: Site) -> None:
    await site.sign_in()
    agent = await site.agent("bob")
    room = (
        await site.api.post("/api/rooms", json={"kind": "dm", "agent_ids": [agent["id"]]})
    ).json()
    for i in range(1, 121):
        site.store.user_post(room["id"], f"message number {i}", None)
    page = (await site.browser.get(f"/rooms/{room['id']}")).text
    assert "message number 120" in page and "message number 71<" in page
    assert "message number 70<" not in page
    older = re.search(r'href="(/rooms/[^"]+\?before=\d+)"', page)
    assert older, "no link to older messages"
    back = (await site.browser.get(older.group(1))).text
    assert "message number 70<" in back and "message number 21<" in back
    assert "message number 71<" not in back


async def test_unread_counts_follow_what_the_user_opened(site: Site) -> None:
    await site.sign_in()
    agent = await site.agent("cid")
    room = (
        await site.api.post("/api/rooms", json={"kind": "dm", "agent_ids": [agent["id"]]})
    ).json()
    cid = AgentIdentity(agent["id"], "cid", "no-computer")
    site.store.reply(cid, room["id"], "one", None)
    site.store.reply(cid, room["id"], "two", None)
    site.store.user_post(room["id"], "mine do not count", None)
    assert site.store.unread_by_user()[room["id"]] == 2
    rooms = (await site.browser.get("/rooms")).text
    assert 'aria-label="2 unread"' in rooms
    await site.browser.get(f"/rooms/{room['id']}")
    assert site.store.unread_by_user()[room["id"]] == 0


async def test_an_agent_form_goes_through_the_api_rules(site: Site) -> None:
    csrf = await site.sign_in()
    await site.agent("dora")
    answer = await site.browser.post(
        "/agents",
        data={
            "csrf": csrf,
            "handle": "dora",
            "name": "Dora 2",
            "model": "local/scripted",
            "back": "/agents",
        },
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/agents"
    page = (await site.browser.get("/agents")).text
    assert "the handle @dora is taken" in page
    answer = await site.browser.post(
        "/agents",
        data={"csrf": csrf, "handle": "BAD HANDLE", "name": "x", "model": "m", "back": "/agents"},
    )
    assert "handle" in (await site.browser.get("/agents")).text
    made = await site.browser.post(
        "/agents", data={"csrf": csrf, "handle": "finn", "name": "Finn", "model": "local/scripted"}
    )
    assert made.status_code == 303 and made.headers["location"].startswith("/agents/")
    assert [a["handle"] for a in site.store.list_agents()] == ["dora", "finn"]


async def test_a_new_computer_shows_its_token_once_with_the_line_to_paste(site: Site) -> None:
    csrf = await site.sign_in()
    answer = await site.browser.post("/computers", data={"csrf": csrf, "name": "laptop"})
    assert answer.status_code == 201
    token = re.search(r'id="new-token" readonly value="(crc_[^"]+)"', answer.text)
    assert token, "no token shown"
    assert site.store.computer_by_token(token.group(1))
    line = re.search(r'id="bootstrap-line"[^>]*>([^<]*)<', answer.text)
    assert line and "crew-computer run --config" in line.group(1)
    # The token is pasted into `read -rs`, never written into the line (shell history).
    assert "read -rs CREW_COMPUTER_TOKEN" in line.group(1) and token.group(1) not in line.group(1)
    again = (await site.browser.get("/computers")).text
    assert token.group(1) not in again


async def test_mute_unmute_and_tasks_through_the_forms(site: Site) -> None:
    csrf = await site.sign_in()
    gus, hal = await site.agent("gus"), await site.agent("hal")
    made = await site.browser.post(
        "/rooms",
        data={"csrf": csrf, "kind": "group", "title": "Ops", "agent_id": [gus["id"], hal["id"]]},
    )
    assert made.status_code == 303
    room_id = made.headers["location"].rsplit("/", 1)[1]
    here = f"/rooms/{room_id}"

    async def send(path: str, **fields: str) -> None:
        answer = await site.browser.post(path, data={"csrf": csrf, "back": here, **fields})
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"] == here

    await send(f"{here}/mutes", agent_id=gus["id"], action="mute")
    assert set(site.store.muted_in(room_id)) == {gus["id"]}
    assert "Unmute @gus" in (await site.browser.get(here)).text
    await send(f"{here}/mutes", agent_id=gus["id"], action="unmute")
    assert site.store.muted_in(room_id) == {}

    await send("/tasks", room_id=room_id, title="Ship it", assignee="hal")
    message = site.store.user_post(room_id, "Write the notes\nwith details", None)
    await send("/tasks/convert", message_id=message["id"])
    await send("/tasks/2/status", status="in_review")
    await send("/tasks/2/assign", assignee="@gus")
    tasks = {t["number"]: t for t in site.store.list_tasks(USER, room_id)}
    assert (tasks[1]["title"], tasks[1]["assignee"], tasks[1]["status"]) == (
        "Ship it",
        "hal",
        "todo",
    )
    assert (tasks[2]["title"], tasks[2]["assignee"], tasks[2]["status"]) == (
        "Write the notes",
        "gus",
        "in_review",
    )
    page = (await site.browser.get(here)).text
    assert "Task #2 · in review · @gus" in page
    # A refused change comes back to the page as a message above its form.
    await send("/tasks/1/assign", assignee="nobody")
    assert "there is no agent @nobody" in (await site.browser.get(here)).text


async def test_a_sign_in_link_carries_a_one_time_code_not_the_user_token(site: Site) -> None:
    minted = await site.api.post("/api/sign-in-codes")
    assert minted.status_code == 201, minted.text
    link = minted.json()
    assert link["path"] == f"/login#code={link['code']}" and site.token not in link["path"]
    assert link["expires_in_s"] == 600
    anonymous = await site.browser.post("/api/sign-in-codes")
    assert anonymous.status_code == 401

    async def post_code(code: str) -> httpx.Response:
        form = await site.browser.get("/login")
        assert 'id="code-form"' in form.text
        return await site.browser.post(
            "/login",
            data={"sign_in": hidden(form.text, "sign_in"), "code": code, "next": "/agents"},
        )

    answer = await post_code(link["code"])
    assert answer.status_code == 303 and answer.headers["location"] == "/agents"
    assert (await site.browser.get("/rooms")).status_code == 200
    # Spent: the same link, from another browser (or from this one's history), fails.
    site.browser.cookies.clear()
    again = await post_code(link["code"])
    assert again.status_code == 401 and "used already" in again.text
    assert "crew_session" not in again.headers.get("set-cookie", "")
    assert (await post_code("csi_made-up")).status_code == 401
    assert (await post_code("é")).status_code == 401


async def test_a_sign_in_code_expires(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    link = (await site.api.post("/api/sign-in-codes")).json()
    started = time.monotonic()
    monkeypatch.setattr(sign_in, "monotonic", lambda: started + 601)
    form = await site.browser.get("/login")
    answer = await site.browser.post(
        "/login", data={"sign_in": hidden(form.text, "sign_in"), "code": link["code"]}
    )
    assert answer.status_code == 401 and "over 10 minutes old" in answer.text
