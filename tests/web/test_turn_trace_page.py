"""A turn page's "where the time went" (issue 26): each step the trace reached, in path
order, with its time since the post and since the step before."""

from __future__ import annotations

import html
import re

import pytest

from crew_server.store import AgentIdentity
from crew_server.web.turn_trace import trace_rows
from tests.web.site import Site

pytestmark = pytest.mark.anyio


def test_rows_follow_the_path_whatever_the_order_of_the_marks() -> None:
    rows = trace_rows({"reply_stored": 1_250, "post": 1_000, "claimed": 1_020, "wake": 1_005})
    assert [(r["step"], r["since"], r["delta"]) for r in rows] == [
        ("post", 0, 0),
        ("wake", 5, 5),
        ("claimed", 20, 15),
        ("reply_stored", 250, 230),
    ]
    assert trace_rows(None) == [] and trace_rows({}) == []
    # Without a post (an older Computer's turn, the server's steps only) the first step is 0.
    assert [r["since"] for r in trace_rows({"reply_received": 7, "reply_stored": 9})] == [0, 2]
    assert trace_rows({"post": "soon"}) == []


async def test_the_turn_page_shows_where_the_time_went(site: Site) -> None:
    await site.sign_in()
    computer_id, _ = site.store.create_computer("box")
    site.store.connect(computer_id, "h", "linux", "1", 1)
    ada = site.store.create_agent("ada", "Ada", "", "local/scripted", "opencode", computer_id)
    room, _ = site.store.create_room("dm", None, [ada["id"]])
    site.store.user_post(room["id"], "one", None)
    site.store.claim_unread(computer_id, ada["id"])
    turn = site.store.register_turn(computer_id, ada["id"], [], "go", "opencode", "m/x", None)
    agent = AgentIdentity(ada["id"], "ada", computer_id, turn["turn_id"])
    site.store.reply(agent, room["id"], "hello", None)
    stored = site.store.get_turn(turn["turn_id"])["trace"]["reply_stored"]
    trace = {"post": stored - 180, "claimed": stored - 170, "engine_accepted": stored - 120}
    site.store.finish_turn(
        computer_id, turn["turn_id"], turn["fence"], "succeeded", None, None, trace=trace
    )

    page = html.unescape((await site.browser.get(f"/turns/{turn['turn_id']}")).text)
    assert "Where the time went" in page
    rows = re.findall(
        r'<tr data-step="([a-z_]+)"><th scope="row">[^<]+</th><td>(\d+) ms</td>', page
    )
    assert rows == [
        ("post", "0"),
        ("claimed", "10"),
        ("engine_accepted", "60"),
        ("reply_received", "180"),
        ("reply_stored", "180"),
    ]
    assert "+50 ms" in page  # claimed → engine accepted


async def test_a_turn_without_a_trace_shows_no_table(site: Site) -> None:
    await site.sign_in()
    computer_id, _ = site.store.create_computer("box")
    site.store.connect(computer_id, "h", "linux", "1", 1)
    ada = site.store.create_agent("ada", "Ada", "", "local/scripted", "opencode", computer_id)
    turn = site.store.register_turn(computer_id, ada["id"], [], "go", "opencode", "m/x", None)
    page = (await site.browser.get(f"/turns/{turn['turn_id']}")).text
    assert page.count("<h2") >= 1 and "Where the time went" not in page
