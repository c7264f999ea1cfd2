"""The web app's edges against anonymous and odd clients (issue 20, item 14).

- A form post without a session is refused before its body is read; the sign-in form's
  body is capped small (an anonymous client cannot make the server parse 1 MiB).
- `GET /login` keeps nothing on the server (the sign-in form's CSRF token is signed,
  not stored), so anonymous requests cannot grow its memory.
- A non-ASCII sign-in or CSRF token is refused like any wrong one (never a 500).
- A live stream ends promptly when its session signs out.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import pytest

from crew_harness.waiting import wait_until_async
from tests.web.site import Site, hidden, open_browser_stream, updates_in

pytestmark = pytest.mark.anyio


class CountedBody:
    """A request body that counts how much of it the server pulled."""

    def __init__(self, size: int, chunk: int = 64 * 1024) -> None:
        self.size, self.chunk, self.pulled = size, chunk, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        sent = 0
        while sent < self.size:
            piece = min(self.chunk, self.size - sent)
            self.pulled += piece
            sent += piece
            yield b"a" * piece


FORM = {"content-type": "application/x-www-form-urlencoded"}


async def test_an_anonymous_form_post_is_refused_before_its_body_is_read(site: Site) -> None:
    body = CountedBody(1024 * 1024)
    answer = await site.browser.post(
        "/rooms", content=body, headers={**FORM, "content-length": str(body.size)}
    )
    assert answer.status_code == 403
    assert "signed out" in answer.text
    assert body.pulled == 0, f"the server read {body.pulled} bytes of an anonymous body"


async def test_the_sign_in_form_takes_a_small_body_only(site: Site) -> None:
    body = CountedBody(1024 * 1024)
    answer = await site.browser.post("/login", content=body, headers=FORM)
    assert answer.status_code == 413
    assert "too large" in answer.text
    assert body.pulled <= 64 * 1024, f"the server read {body.pulled} bytes before refusing"
    declared = await site.browser.post(
        "/login", content=b"a" * 20_000, headers={**FORM, "content-length": "20000"}
    )
    assert declared.status_code == 413
    # Positive control: the form itself still signs in.
    assert await site.sign_in()


async def test_anonymous_sign_in_forms_keep_nothing_on_the_server(site: Site) -> None:
    await site.browser.get("/login")  # templates compiled, caches warm
    gc.collect()
    # Only what the web app's code allocated (the test client's own caches are noise).
    ours = [tracemalloc.Filter(True, "*/crew_server/web/*", all_frames=True)]
    tracemalloc.start(8)
    try:
        before = tracemalloc.take_snapshot().filter_traces(ours)
        for _ in range(200):
            answer = await site.browser.get("/login")
            assert answer.status_code == 200
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(ours)
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    # Stored, each form's token cost ~140 bytes (29 KB here); signed, nothing stays.
    assert grown < 12_000, f"200 anonymous GET /login kept {grown} bytes"
    # An old form still signs in (its token is checked by signature, not looked up).
    form = await site.browser.get("/login")
    await site.browser.get("/login")
    site.browser.cookies.set("crew_sign_in", hidden(form.text, "sign_in"))
    answer = await site.browser.post(
        "/login", data={"sign_in": hidden(form.text, "sign_in"), "token": site.token}
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/rooms"


async def test_a_forged_sign_in_token_is_refused(site: Site) -> None:
    form = await site.browser.get("/login")
    good = hidden(form.text, "sign_in")
    stamp, nonce, mac = good.split(".")
    for forged in (f"{int(stamp) + 99}.{nonce}.{mac}", f"{stamp}.{nonce}.{mac[:-2]}AA", "1.2.3"):
        site.browser.cookies.set("crew_sign_in", forged)
        answer = await site.browser.post("/login", data={"sign_in": forged, "token": site.token})
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login?")
        assert "crew_session" not in answer.headers.get("set-cookie", "")


async def test_non_ascii_tokens_are_refused_not_a_server_error(site: Site) -> None:
    form = await site.browser.get("/login")
    sign_in = hidden(form.text, "sign_in")
    bad_form = await site.browser.post("/login", data={"sign_in": "é" + sign_in, "token": "x"})
    assert bad_form.status_code == 303 and bad_form.headers["location"].startswith("/login?")
    bad_token = await site.browser.post("/login", data={"sign_in": sign_in, "token": "cru_é"})
    assert bad_token.status_code == 401 and "not the user token" in bad_token.text
    csrf = await site.sign_in()
    answer = await site.browser.post("/rooms", data={"csrf": "é" + csrf, "kind": "dm"})
    assert answer.status_code == 403 and "CSRF" in answer.text


async def test_a_live_stream_ends_when_its_session_signs_out(site: Site) -> None:
    csrf = await site.sign_in()
    agent = await site.agent("ada")
    room = (
        await site.api.post("/api/rooms", json={"kind": "dm", "agent_ids": [agent["id"]]})
    ).json()
    async with anyio.create_task_group() as tasks:
        stream, stream_id = await open_browser_stream(site, tasks)
        topic = {
            "stream": stream_id,
            "key": "tab1:timeline",
            "topic": f"/live/rooms/{room['id']}?after=0",
        }
        subscribed = await site.browser.post("/live/subscriptions", data={"csrf": csrf, **topic})
        assert subscribed.status_code == 204, subscribed.text
        # Positive control: the open stream carries what the page needs.
        site.store.user_post(room["id"], "LIVE-BEFORE-SIGN-OUT", None)
        await wait_until_async("the message came live", lambda: "LIVE-BEFORE" in stream.text())
        out = await site.browser.post("/logout", data={"csrf": csrf})
        assert out.status_code == 303
        site.store.user_post(room["id"], "LIVE-AFTER-SIGN-OUT", None)
        with anyio.move_on_after(10):
            await stream.done.wait()
        stream.gone.set()
        tasks.cancel_scope.cancel()
    assert stream.done.is_set(), "the stream was still open 10 s after sign-out"
    assert "LIVE-AFTER-SIGN-OUT" not in stream.text()
    assert updates_in(stream)[-1] == {"mode": "signed-out"}
