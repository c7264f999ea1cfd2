"""Issue 25's small items on the pages: a turn's cost apart from its failure reason and in
a short format, how long it took and a link to the messages that caused it; reminders
said as people say them. (The Computers page's start line: test_pages.py; the sign-in
link in a tab already on /login and the quiet message actions: test_browser_markdown.py.)
"""

from __future__ import annotations

import html
import re

import pytest

from crew_server.rules import Schedule
from crew_server.store.identities import AgentIdentity
from crew_server.web.render import duration, every, money, took
from tests.web.site import Site


@pytest.mark.parametrize(
    ("dollars", "shown"),
    [
        (0, "$0"),
        (None, "$0"),
        (0.00004, "< $0.0001"),
        (0.000144, "$0.00014"),
        (0.0012, "$0.0012"),
        (0.0412, "$0.041"),
        (0.5, "$0.50"),
        (12.345, "$12.35"),
        (1234.5, "$1,234.50"),
    ],
)
def test_money_is_short(dollars: float | None, shown: str) -> None:
    assert money(dollars) == shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0 s"),
        (0.3, "< 1 s"),
        (12, "12 s"),
        (123, "2 min 3 s"),
        (1_800, "30 min"),
        (5_400, "1 h 30 min"),
        (7_200, "2 h"),
        (7_205, "2 h"),  # seconds only under an hour
        (86_400, "1 day"),
        (90_000, "1 day 1 h"),
        (172_800, "2 days"),
    ],
)
def test_durations_read_as_people_say_them(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_a_reminders_period_reads_as_people_say_it() -> None:
    assert [every(s) for s in (7_200, 1_800, 86_400, 90)] == [
        "every 2 h",
        "every 30 min",
        "every day",
        "every 1 min 30 s",
    ]


def test_how_long_a_turn_took() -> None:
    assert took("2026-12-01T10:00:00.000Z", "2026-12-01T10:02:03.500Z") == "2 min 4 s"
    assert took("2026-12-01T10:00:00.000Z", None) == ""  # still running
    assert took("garbage", "2026-12-01T10:00:00Z") == ""


async def failed_turn(site: Site) -> tuple[dict[str, str], dict[str, object], str]:
    """@ada read messages 1–2 of a dm and failed after 123 s, at $0.0012: (agent, room, turn id)."""
    store = site.store
    computer_id, _ = store.create_computer("box")
    store.connect(computer_id, "h", "linux", "1", 1)
    ada = store.create_agent("ada", "Ada", "", "m/x", "opencode", computer_id)
    room, _ = store.create_room("dm", None, [ada["id"]])
    store.user_post(room["id"], "first", None)
    store.user_post(room["id"], "second", None)
    rooms, _ = store.claim_unread(computer_id, ada["id"])
    claim = [{"room_id": room["id"], "from_seq": 1, "to_seq": rooms[0]["messages"][-1]["seq"]}]
    turn = store.register_turn(computer_id, ada["id"], claim, "x", "opencode", "m/x", None)
    store.clock.advance(123)
    usage = {"input_tokens": 10, "output_tokens": 2, "cache_read": 0, "cost": 0.0012}
    failure = {"class": "not_logged_in", "reason": "not logged in to anthropic"}
    store.finish_turn(computer_id, turn["turn_id"], turn["fence"], "failed", failure, usage)
    return ada, room, turn["turn_id"]


@pytest.mark.anyio
async def test_a_turn_row_keeps_cost_and_reason_apart_with_its_duration_and_cause(
    site: Site,
) -> None:
    await site.sign_in()
    ada, room, _ = await failed_turn(site)
    page = html.unescape((await site.browser.get(f"/agents/{ada['id']}")).text)
    row = re.search(r'<li class="turn-row">.*?</li>', page, re.S)
    assert row, page
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row.group(0)))
    assert re.search(r"failed · 2 min 3 s · \$0\.0012 · messages 1–2 not_logged_in ?: not", text)
    # The reason is an element of its own, not glued to the cost.
    assert '<span class="cost" title="what it cost">$0.0012</span>' in row.group(0)
    assert re.search(r'<p class="reason"><span class="failure-class">not_logged_in</span>', page)
    cause = re.search(
        r'<a class="cause" href="([^"]+)" title="[^"]*">messages 1–2</a>', row.group(0)
    )
    assert cause and cause.group(1) == f"/rooms/{room['id']}?before=3"
    # The link opens the room at those messages.
    shown = (await site.browser.get(cause.group(1))).text
    assert "<p>first</p>" in shown and "<p>second</p>" in shown


@pytest.mark.anyio
async def test_the_turn_page_says_how_long_it_took_and_what_caused_it(site: Site) -> None:
    await site.sign_in()
    _, room, turn_id = await failed_turn(site)
    page = html.unescape((await site.browser.get(f"/turns/{turn_id}")).text)
    assert '<dt>Took</dt><dd class="took">2 min 3 s</dd>' in page
    assert '<dd class="cost">$0.0012</dd>' in page
    assert (
        f'<a class="cause" href="/rooms/{room["id"]}?before=3" title="the messages this turn read">messages 1–2</a>'
        in page
    )


@pytest.mark.anyio
async def test_reminders_say_every_2_h_on_the_agent_and_the_tasks_page(site: Site) -> None:
    await site.sign_in()
    store = site.store
    computer_id, _ = store.create_computer("box")
    ada = store.create_agent("ada", "Ada", "", "m/x", "opencode", computer_id)
    room, _ = store.create_room("dm", None, [ada["id"]])
    me = AgentIdentity(ada["id"], "ada", computer_id)
    store.create_reminder(me, room["id"], "stand-up", Schedule(every=7_200))
    store.create_reminder(me, room["id"], "digest", Schedule(every=86_400))
    for path in (f"/agents/{ada['id']}", "/tasks"):
        page = (await site.browser.get(path)).text
        assert "every 2 h" in page and "every day" in page, path
        assert "7200 s" not in page and "86400 s" not in page, path
