"""The room's status line as the pages render it (issue 25), without a browser: "Ada is
working…" with the step, live; one failure line for three failed turns with "how to
fix", Retry and Dismiss; the dismissal a form post with the CSRF token that stays after
a reload. The Computer side is driven through the store, as the computer API does."""

from __future__ import annotations

import html
import re
from typing import Any

import anyio
import orjson
import pytest

from crew_harness.waiting import wait_until_async
from tests.web.site import Site, open_browser_stream, subscribe, updates_in

pytestmark = pytest.mark.anyio

FAILURE = {
    "class": "not_logged_in",
    "reason": "the model provider refused the credentials (HTTP 401: bad key). "
    "Log in again with `opencode auth login`. Or set a key.",
}


def dm_of_ada(site: Site) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """@ada on a connected Computer and her dm: (computer id, agent, room)."""
    store = site.store
    computer_id, _ = store.create_computer("box")
    store.connect(computer_id, "h", "linux", "1", 1)
    ada = store.create_agent("ada", "Ada", "", "m/x", "opencode", computer_id)
    room, _ = store.create_room("dm", None, [ada["id"]])
    return computer_id, ada, room


def start_turn(site: Site, computer_id: str, ada: dict[str, Any], room: dict[str, Any]) -> Any:
    message = site.store.user_post(room["id"], "hello", None)
    served = [{"room_id": room["id"], "from_seq": message["seq"], "to_seq": message["seq"]}]
    return site.store.register_turn(computer_id, ada["id"], served, "x", "opencode", "m/x", None)


def fail(site: Site, computer_id: str, turn: dict[str, Any]) -> None:
    site.store.finish_turn(computer_id, turn["turn_id"], turn["fence"], "failed", FAILURE, None)


def status_region(page: str) -> str:
    found = re.search(r'<div id="room-status"[^>]*>(.*?)</div>\s*<form', page, re.DOTALL)
    assert found, "no #room-status before the composer"
    return html.unescape(found.group(1))


async def room_page(site: Site, room: dict[str, Any]) -> str:
    answer = await site.browser.get(f"/rooms/{room['id']}")
    assert answer.status_code == 200, answer.text
    return answer.text


async def test_three_failed_turns_make_one_line_with_how_to_fix_retry_and_dismiss(
    site: Site,
) -> None:
    csrf = await site.sign_in()
    computer_id, ada, room = dm_of_ada(site)
    assert status_region(await room_page(site, room)).strip() == ""
    turns = []
    for _ in range(3):  # the Computer retrying: a new turn after each failure
        turns.append(start_turn(site, computer_id, ada, room))
        fail(site, computer_id, turns[-1])
    page = await room_page(site, room)
    assert 'role="status" aria-live="polite"' in page
    region = status_region(page)
    assert region.count("couldn't reply") == 1, region
    assert (
        "Ada couldn't reply: not logged in: the model provider refused the credentials "
        "(HTTP 401: bad key)</span>" in region
    )
    assert "opencode auth login" not in region  # the long text stays on the agent page
    assert "failed 3 times, last at" in region
    assert f'<a href="/agents/{ada["id"]}#agent-status">how to fix</a>' in region
    assert f'action="/agents/{ada["id"]}/wake"' in region
    assert f'name="turn_id" value="{turns[-1]["turn_id"]}"' in region

    fields = {
        "agent_id": ada["id"],
        "turn_id": turns[-1]["turn_id"],
        "back": f"/rooms/{room['id']}",
    }
    refused = await site.browser.post(f"/rooms/{room['id']}/status/dismiss", data=fields)
    assert refused.status_code == 403 and "CSRF" in refused.text
    assert "couldn't reply" in status_region(await room_page(site, room))
    dismissed = await site.browser.post(
        f"/rooms/{room['id']}/status/dismiss", data={**fields, "csrf": csrf}
    )
    assert dismissed.status_code == 303
    assert dismissed.headers["location"] == f"/rooms/{room['id']}"
    assert status_region(await room_page(site, room)).strip() == ""  # after a reload too
    # A new failure after the dismissal shows again, counted from there.
    fail(site, computer_id, start_turn(site, computer_id, ada, room))
    region = status_region(await room_page(site, room))
    assert "Ada couldn't reply" in region and "(failed at" in region


async def test_dismissing_what_is_no_failure_goes_back_saying_why(site: Site) -> None:
    csrf = await site.sign_in()
    computer_id, ada, room = dm_of_ada(site)
    turn = start_turn(site, computer_id, ada, room)
    for data, problem in (
        ({"agent_id": ada["id"]}, "the form needs the agent_id and turn_id"),
        ({"agent_id": ada["id"], "turn_id": turn["turn_id"]}, "is not a failed turn"),
    ):
        back = f"/rooms/{room['id']}"
        answer = await site.browser.post(
            f"/rooms/{room['id']}/status/dismiss", data={**data, "csrf": csrf, "back": back}
        )
        assert answer.status_code == 303 and answer.headers["location"] == back
        assert problem in html.unescape(await room_page(site, room))  # the page says why


async def test_the_working_line_comes_and_goes_live_with_the_step(site: Site) -> None:
    csrf = await site.sign_in()
    computer_id, ada, room = dm_of_ada(site)
    async with anyio.create_task_group() as tasks:
        stream, stream_id = await open_browser_stream(site, tasks)
        subscribed = await subscribe(
            site, csrf, stream_id, "r:timeline", f"/live/rooms/{room['id']}?after=0"
        )
        assert subscribed.status_code == 204, subscribed.text

        def status_sent(needle: str) -> list[str]:
            return [
                html.unescape(u["html"])
                for u in updates_in(stream)
                if u.get("target") == "room-status" and needle in html.unescape(u["html"])
            ]

        turn = start_turn(site, computer_id, ada, room)
        [line] = await wait_until_async("the working line", lambda: status_sent("is working"))
        assert "Ada is working…" in line and "starting" in line
        tool = {"call_id": "c1", "tool": "bash", "input": {"command": "npm install"}, "title": None}
        event = {"type": "tool_start", "at": "2026-10-05T09:00:00+00:00"}
        site.store.add_events(
            computer_id,
            turn["turn_id"],
            turn["fence"],
            0,
            [{**event, "data_json": orjson.dumps(tool).decode()}],
        )
        await wait_until_async(
            "the tool step", lambda: status_sent("running <code>bash</code>: npm install")
        )
        site.store.finish_turn(computer_id, turn["turn_id"], turn["fence"], "succeeded", None, None)

        def cleared() -> bool:
            sent = [u for u in updates_in(stream) if u.get("target") == "room-status"]
            return bool(sent) and "is working" not in sent[-1]["html"]

        await wait_until_async("the line gone", cleared)
        tasks.cancel_scope.cancel()
