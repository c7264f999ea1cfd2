"""A tool call on the turn page while it runs and after (issue 25, "live tool calls").

A `tool_start` is listed as running (tool, input, since when, an elapsed count the
page script fills in); the `tool_use` of the same call replaces it in place, live
(one `outer` update whose id a reconnect goes on from) and on a page load (the call
listed once, where it began). A start whose turn ended without its finish says so.
"""

from __future__ import annotations

import html
import re
from typing import Any

import anyio
import orjson
import pytest

from crew_harness.waiting import wait_until_async
from crew_server.web.turn_events import folded_events, shown_event
from tests.web.site import RawStream, Site, open_browser_stream, updates_in

pytestmark = pytest.mark.anyio

AT = "2026-10-05T09:00:00+00:00"
LATER = "2026-10-05T09:00:04+00:00"
INPUT = {"command": "sleep 4; echo done", "description": "Run scripted command"}


def start(call_id: str = "call_1") -> dict[str, Any]:
    data = {"call_id": call_id, "tool": "bash", "input": INPUT, "title": None}
    return {"type": "tool_start", "at": AT, "data": data}


def use(call_id: str | None = "call_1", output: str = "done\n") -> dict[str, Any]:
    data: dict[str, Any] = {
        "tool": "bash",
        "title": INPUT["command"],
        "input": INPUT,
        "output": output,
        "duration_ms": 4012,
        "failed": False,
    }
    if call_id is not None:
        data["call_id"] = call_id
    return {"type": "tool_use", "at": LATER, "data": data}


def step() -> dict[str, Any]:
    return {"type": "step_start", "at": AT, "data": {}}


class Turn:
    """A turn of a new agent, its events added as the Computer would."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.computer_id, _ = site.store.create_computer("box")
        site.store.connect(self.computer_id, "h", "linux", "1", 1)
        agent = site.store.create_agent(
            "ada", "Ada", "", "local/scripted", "opencode", self.computer_id
        )
        turn = site.store.register_turn(
            self.computer_id, agent["id"], [], "go", "opencode", "m/x", None
        )
        self.id, self.fence = str(turn["turn_id"]), turn["fence"]
        self.count = 0

    def add(self, *events: dict[str, Any]) -> None:
        stored = [
            {"type": e["type"], "at": e["at"], "data_json": orjson.dumps(e["data"]).decode()}
            for e in events
        ]
        self.site.store.add_events(self.computer_id, self.id, self.fence, self.count, stored)
        self.count += len(events)

    def finish(self, status: str = "succeeded") -> None:
        self.site.store.finish_turn(self.computer_id, self.id, self.fence, status, None, None)


def items(page: str) -> list[str]:
    """The turn page's event list items, whitespace folded."""
    listed = page.split('id="turn-events"', 1)[1].split("</ol>", 1)[0]
    return [" ".join(item.split()) for item in re.findall(r"<li .*?</li>", listed, re.S)]


async def test_a_running_call_shows_its_tool_input_and_since_when(site: Site) -> None:
    await site.sign_in()
    turn = Turn(site)
    turn.add(step(), start())
    page = html.unescape((await site.browser.get(f"/turns/{turn.id}")).text)
    _, running = items(page)
    assert 'id="e-1"' in running
    assert "Tool call <code>bash</code>" in running and ">running</span>" in running
    assert f'<time datetime="{AT}">2026-10-05 09:00:00</time>' in running
    assert f'data-elapsed-since="{AT}"' in running
    assert "sleep 4; echo done" in running and "tool-output" not in running


async def test_a_finished_call_is_listed_once_where_it_began(site: Site) -> None:
    await site.sign_in()
    turn = Turn(site)
    turn.add(step(), start("call_a"), start("call_b"), use("call_b", "B\n"), use("call_a", "A\n"))
    turn.add(use(None, "no start\n"))  # a cold turn's call: no start, no call id
    turn.finish()
    page = html.unescape((await site.browser.get(f"/turns/{turn.id}")).text)
    listed = items(page)
    assert len(listed) == 4, listed
    # Each call where it began, finished, with the finish's own index as its id.
    assert 'id="e-4"' in listed[1] and 'tool-output">A ' in listed[1]
    assert 'id="e-3"' in listed[2] and 'tool-output">B ' in listed[2]
    assert ">ok</span>" in listed[1] and ">ok</span>" in listed[2]
    assert "no start" in listed[3]
    assert not any("running" in item or "data-elapsed-since" in item for item in listed)


async def test_a_call_its_turn_ended_without_shows_it_did_not_finish(site: Site) -> None:
    await site.sign_in()
    turn = Turn(site)
    turn.add(step(), start())
    turn.finish("cancelled")
    page = html.unescape((await site.browser.get(f"/turns/{turn.id}")).text)
    _, cut = items(page)
    assert "did not finish" in cut and "data-elapsed-since" not in cut


async def test_a_start_without_its_fields_shows_as_malformed() -> None:
    event = {"index": 0, **start()}
    assert shown_event(event)["type"] == "tool_start"
    no_call = {k: v for k, v in start()["data"].items() if k != "call_id"}
    assert shown_event({**event, "data": no_call})["problem"] == "it has no 'call_id'"
    # Not folded with anything either: it is listed as it came.
    assert folded_events([{**event, "data": no_call}], running=False)[0]["data"] == no_call


async def subscribe(site: Site, csrf: str, stream_id: str, topic: str, **more: str) -> None:
    answer = await site.browser.post(
        "/live/subscriptions",
        data={"csrf": csrf, "stream": stream_id, "key": "t:events", "topic": topic, **more},
        headers={"X-Crew-Fetch": "1"},
    )
    assert answer.status_code == 204, answer.text


def event_updates(stream: RawStream) -> list[dict[str, Any]]:
    return [u for u in updates_in(stream) if u.get("key") == "t:events"]


async def test_live_the_finish_replaces_the_running_call_in_place(site: Site) -> None:
    csrf = await site.sign_in()
    turn = Turn(site)
    turn.add(step())
    async with anyio.create_task_group() as tasks:
        stream, stream_id = await open_browser_stream(site, tasks)
        await subscribe(site, csrf, stream_id, f"/live/turns/{turn.id}?from=1")
        turn.add(start())

        def appended() -> list[dict[str, Any]]:
            return [u for u in event_updates(stream) if u["mode"] == "append"]

        [running] = await wait_until_async("the running call", appended)
        assert running["id"] == 1 and ">running</span>" in running["html"]
        turn.add(use())

        def replaced() -> list[dict[str, Any]]:
            return [u for u in event_updates(stream) if u["mode"] == "outer"]

        [done] = await wait_until_async("the finished call", replaced)
        assert done["target"] == "e-1" and done["id"] == 2
        assert 'id="e-2"' in done["html"] and "done\n" in html.unescape(done["html"])
        assert len(appended()) == 1  # not appended as well
        stream.gone.set()
        tasks.cancel_scope.cancel()


async def test_live_after_a_reconnect_a_finish_still_finds_its_start(site: Site) -> None:
    """The tab got the start (`last`) on a stream that ended; the finish came meanwhile."""
    csrf = await site.sign_in()
    turn = Turn(site)
    turn.add(step(), start(), use())
    async with anyio.create_task_group() as tasks:
        stream, stream_id = await open_browser_stream(site, tasks)
        await subscribe(site, csrf, stream_id, f"/live/turns/{turn.id}?from=1", last="1")
        [done] = await wait_until_async(
            "the finished call",
            lambda: [u for u in event_updates(stream) if u["mode"] != "replace"],
        )
        assert (done["mode"], done["target"], done["id"]) == ("outer", "e-1", 2)
        stream.gone.set()
        tasks.cancel_scope.cancel()


async def test_live_a_call_still_running_when_the_turn_ends_did_not_finish(site: Site) -> None:
    csrf = await site.sign_in()
    turn = Turn(site)
    turn.add(step(), start())
    async with anyio.create_task_group() as tasks:
        stream, stream_id = await open_browser_stream(site, tasks)
        await subscribe(site, csrf, stream_id, f"/live/turns/{turn.id}?from=2")
        turn.finish("cancelled")

        def ended() -> list[dict[str, Any]]:
            return [u for u in event_updates(stream) if u["mode"] in ("outer", "end")]

        cut, end = await wait_until_async("the end", lambda: ended() if len(ended()) > 1 else [])
        assert cut["target"] == "e-1" and "did not finish" in cut["html"]
        assert end["mode"] == "end"
        stream.gone.set()
        tasks.cancel_scope.cancel()
