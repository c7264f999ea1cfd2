"""The browser's one live stream in-process (`GET /live` and its subscriptions): it
carries the topics of every tab, stops a tab's topics when it leaves, resumes without
sending anything twice, and serves only its own session. The browser side (eight tabs
through the SharedWorker) is in test_browser_streams.py."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from crew_harness.waiting import wait_until_async
from tests.web.site import RawStream, Site, hidden, open_browser_stream, subscribe, updates_in

pytestmark = pytest.mark.anyio
FETCH = {"X-Crew-Fetch": "1"}


async def dm(site: Site, handle: str) -> str:
    agent = await site.agent(handle)
    answer = await site.api.post("/api/rooms", json={"kind": "dm", "agent_ids": [agent["id"]]})
    return str(answer.json()["id"])


def bodies(stream: RawStream, key: str) -> list[str]:
    return [u["html"] for u in updates_in(stream) if u.get("key") == key and u["mode"] == "append"]


async def test_one_stream_carries_the_topics_of_every_tab(site: Site) -> None:
    csrf = await site.sign_in()
    first, second = await dm(site, "ada"), await dm(site, "bob")
    async with anyio.create_task_group() as tasks:
        stream, stream_id = await open_browser_stream(site, tasks)
        for key, topic in (("t1:timeline", first), ("t2:timeline", second)):
            answer = await subscribe(site, csrf, stream_id, key, f"/live/rooms/{topic}?after=0")
            assert answer.status_code == 204, answer.text
        site.store.user_post(first, "TO-TAB-ONE", None)
        site.store.user_post(second, "TO-TAB-TWO", None)
        await wait_until_async("both tabs' messages", lambda: bodies(stream, "t2:timeline"))
        await wait_until_async("tab one's message", lambda: bodies(stream, "t1:timeline"))
        assert "TO-TAB-ONE" in bodies(stream, "t1:timeline")[0]
        assert "TO-TAB-TWO" in bodies(stream, "t2:timeline")[0]
        assert {u["target"] for u in updates_in(stream) if u.get("key")} >= {"timeline"}

        left = await site.browser.post(
            "/live/subscriptions/leave",
            data={"csrf": csrf, "stream": stream_id, "key": "t1:timeline"},
            headers=FETCH,
        )
        assert left.status_code == 204
        site.store.user_post(first, "AFTER-TAB-ONE-LEFT", None)
        site.store.user_post(second, "TAB-TWO-STILL-HERE", None)
        await wait_until_async("tab two's second", lambda: len(bodies(stream, "t2:timeline")) == 2)
        # One more poll for tab two: the first room, polled before it, sent nothing.
        assert "AFTER-TAB-ONE-LEFT" not in stream.text()
        stream.gone.set()
        tasks.cancel_scope.cancel()


async def test_a_resubscription_sends_nothing_twice(site: Site) -> None:
    csrf = await site.sign_in()
    room = await dm(site, "cy")
    seen = site.store.user_post(room, "ALREADY-SHOWN", None)
    site.store.user_post(room, "NOT-YET-SHOWN", None)
    async with anyio.create_task_group() as tasks:
        stream, stream_id = await open_browser_stream(site, tasks)
        # The page was rendered before both; the tab got the first one on a stream that
        # has since ended (`last`): the new stream sends only the second.
        answer = await subscribe(
            site,
            csrf,
            stream_id,
            "t:timeline",
            f"/live/rooms/{room}?after=0",
            last=str(seen["seq"]),
        )
        assert answer.status_code == 204, answer.text
        got = await wait_until_async("the missed message", lambda: bodies(stream, "t:timeline"))
        assert len(got) == 1 and "NOT-YET-SHOWN" in got[0]
        stream.gone.set()
        tasks.cancel_scope.cancel()


async def test_a_stream_serves_only_its_own_session(site: Site) -> None:
    csrf = await site.sign_in()
    room = await dm(site, "dee")
    transport: Any = site.browser._transport
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://testserver") as other,
        anyio.create_task_group() as tasks,
    ):
        form = await other.get("/login")
        await other.post(
            "/login", data={"sign_in": hidden(form.text, "sign_in"), "token": site.token}
        )
        other_csrf = hidden((await other.get("/rooms")).text, "csrf")
        stream, stream_id = await open_browser_stream(site, tasks)
        answer = await other.post(
            "/live/subscriptions",
            data={
                "csrf": other_csrf,
                "stream": stream_id,
                "key": "x",
                "topic": f"/live/rooms/{room}",
            },
            headers=FETCH,
        )
        assert answer.status_code == 404 and "ended" in answer.text
        # Without a session, or without the CSRF token, nothing is subscribed either.
        site.browser.cookies.delete("crew_session")
        anonymous = await subscribe(site, csrf, stream_id, "y", f"/live/rooms/{room}")
        assert anonymous.status_code == 403
        stream.gone.set()
        tasks.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("key", "topic", "last", "problem"),
    [
        ("k", "/live/nothing", "", "no live topic"),
        ("k", "/live/rooms/not-a-uuid", "", "no live topic"),
        ("k", "/live/rooms?after=x1", "", "position"),
        ("k" * 101, "/live/rooms", "", "key"),
        ("k", "/live/rooms", "9" * 5000, "last"),
        ("k", "/live/turns/00000000-0000-4000-8000-000000000000", "", "turn"),
    ],
)
async def test_bad_subscriptions_are_refused_clearly(
    site: Site, key: str, topic: str, last: str, problem: str
) -> None:
    csrf = await site.sign_in()
    async with anyio.create_task_group() as tasks:
        stream, stream_id = await open_browser_stream(site, tasks)
        answer = await subscribe(site, csrf, stream_id, key, topic, last=last)
        assert answer.status_code in (404, 422), answer.text
        assert problem in answer.text
        stream.gone.set()
        tasks.cancel_scope.cancel()
