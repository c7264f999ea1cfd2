"""The web app's deleting, renaming and members (issue 25): each destructive link leads to
a confirmation page that says what goes and changes nothing; only its form (with the
session's CSRF token) deletes. Every form here is refused without the token, and then
nothing changes."""

from __future__ import annotations

import html

import anyio
import pytest

from crew_harness.waiting import wait_until_async
from crew_server.errors import NotFound
from tests.web.site import Site, open_browser_stream, subscribe, updates_in

pytestmark = pytest.mark.anyio


async def crew(site: Site) -> tuple[str, str, dict[str, str], dict[str, str]]:
    """A Computer `box` with agents ada and bob, a group of both with a message, ada's dm."""
    computer_id, _ = site.store.create_computer("box")
    ada, bob = await site.agent("ada", computer_id), await site.agent("bob", computer_id)
    group, _ = site.store.create_room("group", "Crew", [ada["id"], bob["id"]])
    site.store.user_post(group["id"], "hello both", None)
    dm, _ = site.store.create_room("dm", None, [ada["id"]])
    site.store.user_post(dm["id"], "hello ada", None)
    return str(group["id"]), computer_id, ada, bob


async def test_deleting_an_agent_asks_first_and_then_deletes(site: Site) -> None:
    csrf = await site.sign_in()
    group_id, _, ada, _ = await crew(site)
    agent_page = (await site.browser.get(f"/agents/{ada['id']}")).text
    assert (
        f'<a class="danger" href="/agents/{ada["id"]}/delete">Delete this agent</a>' in agent_page
    )

    asked = await site.browser.get(f"/agents/{ada['id']}/delete")
    text = html.unescape(asked.text)
    assert asked.status_code == 200
    assert '<h1 id="confirm-title">Delete Ada (@ada)?</h1>' in text
    assert "Ada's direct chat goes, with its 1 message." in text
    assert "Ada leaves 1 group; what Ada wrote there stays, signed “Ada (deleted)”." in text
    assert f'action="/agents/{ada["id"]}/delete"' in text
    assert f'<a href="/agents/{ada["id"]}">Cancel</a>' in text
    # Asking changed nothing.
    assert site.store.get_agent(ada["id"])["handle"] == "ada"

    done = await site.browser.post(f"/agents/{ada['id']}/delete", data={"csrf": csrf})
    assert done.status_code == 303 and done.headers["location"] == "/agents"
    agents = (await site.browser.get("/agents")).text
    assert "Ada (@ada) was deleted." in agents and f'/agents/{ada["id"]}"' not in agents
    with pytest.raises(NotFound):
        site.store.get_agent(ada["id"])
    assert [r["kind"] for r in site.store.list_rooms()] == ["group"]
    gone = await site.browser.get(f"/agents/{ada['id']}/delete")
    assert gone.status_code == 404
    assert group_id in {r["id"] for r in site.store.list_rooms()}


async def test_renaming_a_group_and_changing_its_agents_in_the_aside(site: Site) -> None:
    csrf = await site.sign_in()
    group_id, _, ada, bob = await crew(site)
    page = html.unescape((await site.browser.get(f"/rooms/{group_id}")).text)
    assert '<h2 id="room-settings-title">Room settings</h2>' in page
    assert 'id="room-name" name="title" required maxlength="200" value="Crew"' in page
    assert f'name="agent_id" value="{ada["id"]}" checked> Ada (@ada)' in page
    assert f'<a class="danger" href="/rooms/{group_id}/delete">Delete this room</a>' in page

    renamed = await site.browser.post(
        f"/rooms/{group_id}/title",
        data={"csrf": csrf, "title": "Ship it", "back": f"/rooms/{group_id}"},
    )
    assert renamed.status_code == 303 and renamed.headers["location"] == f"/rooms/{group_id}"
    assert site.store.get_room(group_id)["title"] == "Ship it"
    blank = await site.browser.post(f"/rooms/{group_id}/title", data={"csrf": csrf, "title": " "})
    assert blank.status_code == 303
    shown = html.unescape((await site.browser.get(f"/rooms/{group_id}")).text)
    assert (
        "the form is invalid: title" in shown
        and site.store.get_room(group_id)["title"] == "Ship it"
    )

    changed = await site.browser.post(
        f"/rooms/{group_id}/members", data={"csrf": csrf, "agent_id": [bob["id"]]}
    )
    assert changed.status_code == 303
    members = [m.get("handle") for m in site.store.get_room(group_id)["members"]]
    assert members == [None, "bob"]
    page = html.unescape((await site.browser.get(f"/rooms/{group_id}")).text)
    assert f'name="agent_id" value="{ada["id"]}"> Ada (@ada)' in page


async def test_a_dm_has_only_the_delete_link_and_refuses_a_rename(site: Site) -> None:
    csrf = await site.sign_in()
    _, _, ada, _ = await crew(site)
    dm = next(r for r in site.store.list_rooms() if r["kind"] == "dm")
    page = (await site.browser.get(f"/rooms/{dm['id']}")).text
    assert "Room settings" in page and 'id="room-name"' not in page
    assert f'href="/rooms/{dm["id"]}/delete"' in page
    refused = await site.browser.post(f"/rooms/{dm['id']}/title", data={"csrf": csrf, "title": "x"})
    assert refused.status_code == 303
    shown = html.unescape((await site.browser.get(f"/rooms/{dm['id']}")).text)
    assert "a dm is between you and one agent" in shown

    asked = html.unescape((await site.browser.get(f"/rooms/{dm['id']}/delete")).text)
    assert "Delete the direct chat with Ada?" in asked and "Its 1 message, 0 threads" in asked
    done = await site.browser.post(f"/rooms/{dm['id']}/delete", data={"csrf": csrf})
    assert done.status_code == 303 and done.headers["location"] == "/rooms"
    assert "Ada was deleted." in (await site.browser.get("/rooms")).text
    assert [r["kind"] for r in site.store.list_rooms()] == ["group"]
    assert site.store.get_agent(ada["id"])["handle"] == "ada"


async def test_deleting_a_computer_from_its_row(site: Site) -> None:
    csrf = await site.sign_in()
    _, computer_id, ada, _ = await crew(site)
    page = (await site.browser.get("/computers")).text
    assert f'href="/computers/{computer_id}/delete">Delete box (revokes its token)</a>' in page
    asked = html.unescape((await site.browser.get(f"/computers/{computer_id}/delete")).text)
    assert "Delete the Computer box?" in asked and "Its 2 agents stay" in asked

    done = await site.browser.post(f"/computers/{computer_id}/delete", data={"csrf": csrf})
    assert done.status_code == 303 and done.headers["location"] == "/computers"
    page = (await site.browser.get("/computers")).text
    assert "The Computer box was deleted; its token is revoked." in page
    assert site.store.list_computers() == []
    assert site.store.get_agent(ada["id"])["computer_id"] is None
    assert (await site.browser.get(f"/computers/{computer_id}/delete")).status_code == 404


async def test_every_form_is_refused_without_the_csrf_token_and_changes_nothing(
    site: Site,
) -> None:
    await site.sign_in()
    group_id, computer_id, ada, bob = await crew(site)
    posts = [
        (f"/agents/{ada['id']}/delete", {}),
        (f"/rooms/{group_id}/delete", {}),
        (f"/computers/{computer_id}/delete", {}),
        (f"/rooms/{group_id}/title", {"title": "Renamed"}),
        (f"/rooms/{group_id}/members", {"agent_id": bob["id"]}),
    ]
    for path, data in posts:
        for csrf in (None, "not-the-token"):
            fields = data if csrf is None else {**data, "csrf": csrf}
            answer = await site.browser.post(path, data=fields)
            assert answer.status_code == 403, path
            assert "did not carry this session's CSRF token" in html.unescape(answer.text)
    assert [a["handle"] for a in site.store.list_agents()] == ["ada", "bob"]
    assert [c["id"] for c in site.store.list_computers()] == [computer_id]
    room = site.store.get_room(group_id)
    assert room["title"] == "Crew"
    assert [m.get("handle") for m in room["members"]] == [None, "ada", "bob"]
    assert len(site.store.list_rooms()) == 2


async def test_a_live_page_of_a_deleted_room_ends(site: Site) -> None:
    """A tab open on the room when it is deleted: its topic ends (and says why)."""
    csrf = await site.sign_in()
    group_id, _, _, _ = await crew(site)
    async with anyio.create_task_group() as tasks:
        stream, stream_id = await open_browser_stream(site, tasks)
        answer = await subscribe(
            site, csrf, stream_id, "t1:timeline", f"/live/rooms/{group_id}?after=1"
        )
        assert answer.status_code == 204, answer.text
        done = await site.browser.post(f"/rooms/{group_id}/delete", data={"csrf": csrf})
        assert done.status_code == 303

        def ended() -> list[dict[str, object]]:
            return [u for u in updates_in(stream) if u.get("mode") == "end"]

        [end] = await wait_until_async("the topic to end", ended)
        assert end["key"] == "t1:timeline" and f"no room {group_id}" in str(end["html"])
        stream.gone.set()
        tasks.cancel_scope.cancel()
