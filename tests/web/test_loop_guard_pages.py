"""The web app's side of the loop guard (issue 24): a group's page shows whether agents
are paused there, why and since when, and its form changes the room's limits (a bad
value comes back with the reason, nothing stored)."""

from __future__ import annotations

import html

import pytest

from crew_server.errors import Held
from crew_server.store.identities import AgentIdentity
from tests.web.site import Site

pytestmark = pytest.mark.anyio


async def group(site: Site) -> tuple[str, list[dict[str, str]]]:
    computer_id, _ = site.store.create_computer("box")
    agents = [await site.agent(h, computer_id) for h in ("ada", "bob")]
    room, _ = site.store.create_room("group", "pair", [a["id"] for a in agents])
    return str(room["id"]), agents


def agent_says(site: Site, agent: dict[str, str], room_id: str, body: str) -> None:
    identity = AgentIdentity(agent["id"], agent["handle"], agent["computer_id"], None)
    try:
        site.store.reply(identity, room_id, body, None)
    except Held:
        site.store.reply(identity, room_id, body, None)  # it has seen the news now


async def test_the_room_page_shows_the_pause_and_the_form_changes_the_limits(
    site: Site,
) -> None:
    csrf = await site.sign_in()
    room_id, agents = await group(site)
    page = html.unescape((await site.browser.get(f"/rooms/{room_id}")).text)
    assert "Loop guard" in page and 'id="agents-paused"' not in page
    assert 'name="agent_hop_limit" type="number" min="0" max="100" required value="3"' in page

    saved = await site.browser.post(
        f"/rooms/{room_id}/loop-guard",
        data={"csrf": csrf, "agent_hop_limit": "1", "agent_rate_limit": "30"},
    )
    assert saved.status_code == 303 and saved.headers["location"] == f"/rooms/{room_id}"
    shown = site.store.get_room(room_id)
    assert (shown["agent_hop_limit"], shown["agent_rate_limit"]) == (1, 30)

    site.store.user_post(room_id, "talk", None)
    agent_says(site, agents[0], room_id, "hi bob")
    agent_says(site, agents[1], room_id, "hi ada")
    page = html.unescape((await site.browser.get(f"/rooms/{room_id}")).text)
    assert (
        'Agents paused here since <time datetime="2026-10-05T09:00:00.000000+00:00">'
        "2026-10-05 09:00:00</time>: the hop limit was reached." in page
    )
    assert "Agents paused here until someone writes (2 agent messages in a row" in page
    rooms = (await site.browser.get("/rooms")).text
    assert 'title="Agents paused here until someone writes">paused</span>' in rooms

    # Someone writes: the pause is gone from the page.
    await site.browser.post(f"/rooms/{room_id}/messages", data={"csrf": csrf, "body": "ok"})
    page = (await site.browser.get(f"/rooms/{room_id}")).text
    assert 'id="agents-paused"' not in page and "0 agent messages in a row" in page
    assert ">paused</span>" not in (await site.browser.get("/rooms")).text


@pytest.mark.parametrize(
    ("hops", "rate", "reason"),
    [
        ("-1", "12", "agent_hop_limit"),
        ("101", "12", "agent_hop_limit"),
        ("three", "12", "agent_hop_limit"),
        ("3", "0", "agent_rate_limit"),
        ("3", "", "agent_rate_limit"),
    ],
)
async def test_a_bad_limit_comes_back_with_the_reason(
    site: Site, hops: str, rate: str, reason: str
) -> None:
    csrf = await site.sign_in()
    room_id, _ = await group(site)
    refused = await site.browser.post(
        f"/rooms/{room_id}/loop-guard",
        data={"csrf": csrf, "agent_hop_limit": hops, "agent_rate_limit": rate},
    )
    assert refused.status_code == 303
    page = html.unescape((await site.browser.get(refused.headers["location"])).text)
    assert f"the form is invalid: {reason}" in page
    shown = site.store.get_room(room_id)
    assert (shown["agent_hop_limit"], shown["agent_rate_limit"]) == (3, 12)
