"""The live stream is pushed, not polled (issue 25): a commit wakes it, in this process
or (PostgreSQL) in another; it ends at once when the server stops or the session signs
out; throttled summaries ask for the look they skipped; the post of a page's composer
echoes its client id on the message it renders.

The safety look is set to an hour in these tests, so only the store's signal (or the
stream's own end) can make a stream send anything within a test's wait."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import anyio
import pytest

from crew_harness.waiting import wait_until_async
from crew_server.store import Store
from crew_server.web import live
from crew_server.web.session import Session
from crew_server.web.streams import BrowserStream, Update
from crew_testkit.postgres import PostgresCluster
from tests.web.site import Site, open_browser_stream, served, subscribe, updates_in

pytestmark = pytest.mark.anyio
FETCH = {"X-Crew-Fetch": "1"}


LOOKS: list[int] = []


@pytest.fixture(autouse=True)
def no_safety_look(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a signal wakes a stream within a test (the slow look waits an hour); the
    streams' looks are counted (a test posts once its stream has gone back to sleep)."""
    monkeypatch.setattr(live, "SAFETY_SECONDS", 3600.0)
    monkeypatch.delenv("CREW_WEB_LIVE", raising=False)
    looked = live.look
    LOOKS.clear()

    def counted(stream: BrowserStream, wakes: int) -> tuple[list[tuple[str, Update]], float]:
        LOOKS.append(1)
        return looked(stream, wakes)

    monkeypatch.setattr(live, "look", counted)


async def dm(site: Site, handle: str) -> str:
    agent = await site.agent(handle)
    answer = await site.api.post("/api/rooms", json={"kind": "dm", "agent_ids": [agent["id"]]})
    return str(answer.json()["id"])


async def subscribed(site: Site, csrf: str, stream_id: str, room: str) -> None:
    answer = await subscribe(site, csrf, stream_id, "t:timeline", f"/live/rooms/{room}")
    assert answer.status_code == 204, answer.text
    # The subscription's first look (after the hello's): the stream sleeps after it.
    await wait_until_async("the subscription's look", lambda: len(LOOKS) >= 2)


def appended(stream: object) -> list[str]:
    return [u["html"] for u in updates_in(stream) if u.get("mode") == "append"]  # type: ignore[arg-type]


async def test_a_commit_wakes_the_stream(site: Site) -> None:
    csrf = await site.sign_in()
    room = await dm(site, "ada")
    async with anyio.create_task_group() as tasks:
        stream, stream_id = await open_browser_stream(site, tasks)
        await subscribed(site, csrf, stream_id, room)
        site.store.user_post(room, "PUSHED-ONE", None)
        await wait_until_async("the first message", lambda: appended(stream))
        # A second commit, after the stream went back to sleep: woken again.
        site.store.user_post(room, "PUSHED-TWO", None)
        got = await wait_until_async("the second", lambda: len(appended(stream)) == 2)
        assert got
        assert "PUSHED-ONE" in appended(stream)[0] and "PUSHED-TWO" in appended(stream)[1]
        stream.gone.set()
        tasks.cancel_scope.cancel()


async def test_the_stream_ends_when_the_server_stops() -> None:
    async with served(":memory:") as (site, hub):
        await site.sign_in()
        async with anyio.create_task_group() as tasks:
            stream, _ = await open_browser_stream(site, tasks)
            hub.close()
            # Without the hub's wake it would sleep for the (hour-long) safety look.
            await wait_until_async("the stream's end", stream.done.is_set)
            tasks.cancel_scope.cancel()


async def test_the_stream_says_signed_out_at_once(site: Site) -> None:
    csrf = await site.sign_in()
    async with anyio.create_task_group() as tasks:
        stream, _ = await open_browser_stream(site, tasks)
        out = await site.browser.post("/logout", data={"csrf": csrf})
        assert out.status_code == 303
        await wait_until_async("the stream's end", stream.done.is_set)
        assert updates_in(stream)[-1] == {"mode": "signed-out"}
        tasks.cancel_scope.cancel()


def test_a_throttled_summary_asks_for_the_look_it_skipped() -> None:
    """`every`: the first call runs; a call within the interval after a new wake is
    skipped and asks the stream to look again when the interval ends (else the last
    change would wait for the safety look); a look with no wake since it ran skips it
    and asks nothing (else the throttles would keep an idle stream looking)."""
    runs: list[int] = []

    def summary() -> list[Update]:
        runs.append(1)
        return [Update("rooms-nav", "replace", f"<li>{len(runs)}</li>")]

    stream = BrowserStream("s", Session("id", "csrf", 0.0))
    stream.subscribe("t:rooms", live.every(60.0, summary))
    found, again_at = live.look(stream, 1)
    assert [u.html for _, u in found] == ["<li>1</li>"] and again_at == math.inf
    assert live.look(stream, 1) == ([], math.inf)
    found, again_at = live.look(stream, 2)
    assert found == [] and runs == [1]
    assert math.isfinite(again_at)


async def test_the_post_answers_its_id_and_the_stream_echoes_the_client_id(site: Site) -> None:
    csrf = await site.sign_in()
    room = await dm(site, "bo")
    async with anyio.create_task_group() as tasks:
        stream, stream_id = await open_browser_stream(site, tasks)
        await subscribed(site, csrf, stream_id, room)
        fields = {"csrf": csrf, "body": "MINE", "client_id": "c-tab1_7"}
        answer = await site.browser.post(f"/rooms/{room}/messages", data=fields, headers=FETCH)
        assert answer.status_code == 200, answer.text
        sent = answer.json()
        html = (await wait_until_async("my message", lambda: appended(stream)))[0]
        assert f'id="m-{sent["id"]}"' in html and 'data-client-id="c-tab1_7"' in html
        stream.gone.set()
        tasks.cancel_scope.cancel()
    refused = await site.browser.post(
        f"/rooms/{room}/messages",
        data={"csrf": csrf, "body": "x", "client_id": '"><script>'},
        headers=FETCH,
    )
    assert refused.status_code == 422 and "client_id must be" in refused.text
    page = await site.browser.get(f"/rooms/{room}")
    assert page.text.count("data-client-id") == 1  # the one message posted with it


@pytest.fixture
async def two_processes(postgres_cluster: PostgresCluster) -> AsyncIterator[tuple[Site, Store]]:
    """A site on PostgreSQL, and a second store on the same database (its own
    connections, as another server process has)."""
    location = postgres_cluster.new_schema()
    async with served(location) as (site, _):
        other = Store(location, site.store.clock)
        yield site, other
        other.close()


async def test_a_commit_of_another_process_wakes_the_stream(
    two_processes: tuple[Site, Store],
) -> None:
    site, other = two_processes
    csrf = await site.sign_in()
    room = await dm(site, "cy")
    async with anyio.create_task_group() as tasks:
        stream, stream_id = await open_browser_stream(site, tasks)
        await subscribed(site, csrf, stream_id, room)
        other.user_post(room, "FROM-THE-OTHER-PROCESS", None)
        got = await wait_until_async("the other process's message", lambda: appended(stream))
        assert "FROM-THE-OTHER-PROCESS" in got[0]
        stream.gone.set()
        tasks.cancel_scope.cancel()
